//! Delivering a webhook: the outbox handler of kind [`WEBHOOK_KIND`](super::events::WEBHOOK_KIND).
//!
//! | what happened | outcome |
//! |---|---|
//! | an `email.requested` event whose link was used or superseded since (or a decoy's) | skipped: never delivered |
//! | the endpoint was removed / is disabled | dead (an operator may re-drive after `enable`) |
//! | its URL or the address its host resolves to is refused ([`UrlPolicy`]) | dead, no connection made |
//! | 2xx | sent |
//! | 410 Gone | the endpoint is disabled (logged, shown by `list`), the job dead |
//! | any other status (429 and 3xx included: a redirect is never followed) | retried |
//! | connection failure | retried |
//! | timeout or broken connection after the request was sent | unknown: retried, same `webhook-id` |
//!
//! Never [`Delivery::Throttled`] with a wait or [`Delivery::Refused`]: those hold or pause the
//! whole kind in the worker, every tenant's webhooks, and one endpoint must not silence the
//! others.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use oncely::ServerSecret;
use oncely_outbox::{Delivery, Handler, Job};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use super::url::{CheckingResolver, UrlPolicy, refused_address};
use crate::accounts::{Accounts, EndpointRecord, live_token};
use crate::secret::signing::{self, SigningSecret, signature_header, unseal};

/// How much of an answer's body is read (for the reason of a failure); the rest is dropped.
pub const BODY_CAP: usize = 4 * 1024;

/// How much of that body a reason quotes.
const REASON_BODY_CHARS: usize = 200;

/// At most this many webhook deliveries at once in one worker: the kind is claimed on its own,
/// so that slow endpoints never take the email kinds' slots.
pub const WEBHOOK_CONCURRENCY: u32 = 64;

/// At most this many deliveries to one endpoint at once in one worker (the outbox's per-partition
/// limit; each delivery's partition is its endpoint): an endpoint that is slow or times out
/// holds these slots only, and the kind's other slots go to other endpoints.
pub const WEBHOOK_PER_ENDPOINT: u32 = 2;

/// The `user-agent` of every delivery.
pub const USER_AGENT: &str = concat!("oncely-webhooks/", env!("CARGO_PKG_VERSION"));

/// What deliveries may reach and how long they may take (`ONCELY_ENV`,
/// `ONCELY_WEBHOOK_ALLOW_PRIVATE`, `ONCELY_WEBHOOK_TIMEOUT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WebhookSettings {
    /// Which URLs and addresses.
    pub policy: UrlPolicy,
    /// Connect and total timeout of one attempt.
    pub timeout: Duration,
}

impl WebhookSettings {
    /// The default timeout, `ONCELY_WEBHOOK_TIMEOUT`'s default.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// Development's defaults: loopback allowed, 10 s.
    pub fn development() -> Self {
        Self {
            policy: UrlPolicy {
                production: false,
                allow_private: false,
            },
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }
}

/// The client of every delivery, built once: no redirects followed, no proxies from the
/// environment, a connect and a total timeout, and a resolver that drops refused addresses.
pub fn client(settings: WebhookSettings) -> Result<reqwest::Client, reqwest::Error> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(settings.timeout)
        .connect_timeout(settings.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .user_agent(USER_AGENT)
        .dns_resolver(CheckingResolver {
            policy: settings.policy,
        })
        .build()
}

/// The outbox handler of webhook jobs. Cheap to clone (one client, shared).
#[derive(Clone)]
pub struct WebhookDelivery<A> {
    accounts: A,
    secret: ServerSecret,
    policy: UrlPolicy,
    client: reqwest::Client,
}

impl<A> std::fmt::Debug for WebhookDelivery<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookDelivery")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<A: Accounts> WebhookDelivery<A> {
    /// A handler reading endpoints from `accounts`, unsealing their secrets with `secret` (and
    /// its previous ones).
    pub fn new(
        accounts: A,
        secret: ServerSecret,
        settings: WebhookSettings,
    ) -> Result<Self, reqwest::Error> {
        Ok(Self {
            accounts,
            secret,
            policy: settings.policy,
            client: client(settings)?,
        })
    }

    async fn deliver(&self, job: &Job) -> Delivery {
        let field = |name: &str| job.payload[name].as_str().map(str::to_owned);
        let (Some(endpoint_id), Some(event_id)) = (
            field("endpoint_id").and_then(|id| id.parse::<Uuid>().ok()),
            field("event_id"),
        ) else {
            return Delivery::Permanent("the payload lacks endpoint_id or event_id".into());
        };
        let kind = field("type").unwrap_or_default();
        let body = match self.body(job).await {
            Ok(body) => body,
            Err(outcome) => {
                tracing::info!(endpoint = %endpoint_id, event = %event_id, r#type = %kind, ?outcome, "webhook not attempted");
                return outcome;
            }
        };
        let outcome = self.attempt(endpoint_id, &event_id, body).await;
        let (label, status) = match &outcome {
            Attempted::Sent(status) => ("sent", Some(*status)),
            Attempted::Gone => ("gone", Some(410)),
            Attempted::Failed(_, status) => ("retry", *status),
            Attempted::Unknown(_) => ("unknown", None),
            Attempted::Dead(_) => ("dead", None),
        };
        metrics::counter!("oncely_webhook_deliveries_total", "outcome" => label).increment(1);
        tracing::info!(endpoint = %endpoint_id, event = %event_id, r#type = %kind, status, outcome = label, "webhook attempt");
        match outcome {
            Attempted::Sent(_) => Delivery::Sent {
                provider_message_id: None,
            },
            Attempted::Gone => {
                let reason = format!(
                    "410 Gone at {}",
                    crate::display::when(OffsetDateTime::now_utc())
                );
                tracing::warn!(endpoint = %endpoint_id, event = %event_id, "the webhook endpoint answered 410 Gone: disabled");
                if let Err(error) = self
                    .accounts
                    .set_webhook_disabled(endpoint_id, Some(&reason))
                    .await
                {
                    tracing::error!(endpoint = %endpoint_id, %error, "could not disable the webhook endpoint");
                    return Delivery::Retry(format!(
                        "the endpoint answered 410 Gone, and disabling it failed: {error}"
                    ));
                }
                Delivery::Permanent(format!(
                    "the endpoint answered 410 Gone: it is disabled ({reason})"
                ))
            }
            Attempted::Failed(reason, _) => Delivery::Retry(reason),
            Attempted::Unknown(reason) => Delivery::Unknown(reason),
            Attempted::Dead(reason) => Delivery::Permanent(reason),
        }
    }

    /// The body to send: the payload's `body` as it is, or — an `email.requested` event of a
    /// token email — its `parts` joined with the token of record `token_id`, derived again now
    /// after the same live check as the email handlers' ([`live_token`]): a link
    /// used or superseded since is skipped, never delivered. The token is derived, never read:
    /// the same bytes on every attempt.
    async fn body(&self, job: &Job) -> Result<String, Delivery> {
        let body = &job.payload["body"];
        if let Some(body) = body.as_str() {
            return Ok(body.to_owned());
        }
        let parts: Option<Vec<&str>> = body["parts"]
            .as_array()
            .and_then(|parts| parts.iter().map(Value::as_str).collect());
        let token_id = job.payload["token_id"]
            .as_str()
            .and_then(|id| id.parse::<Uuid>().ok());
        let (Some(parts), Some(token_id)) = (parts, token_id) else {
            return Err(Delivery::Permanent(
                "the payload has no body (neither a text nor parts and a token_id)".into(),
            ));
        };
        let (_, _, token) = live_token(&self.accounts, &self.secret, token_id).await?;
        Ok(parts.join(token.expose()))
    }

    async fn attempt(&self, endpoint_id: Uuid, event_id: &str, body: String) -> Attempted {
        let endpoint = match self.accounts.webhook_endpoint(endpoint_id).await {
            Ok(Some(endpoint)) => endpoint,
            Ok(None) => return Attempted::Dead("the endpoint was removed".into()),
            Err(error) => {
                return Attempted::Failed(format!("reading the endpoint: {error}"), None);
            }
        };
        if endpoint.disabled_at_ms.is_some() {
            return Attempted::Dead("the endpoint is disabled".into());
        }
        if let Err(refused) = self.policy.allow(&endpoint.url) {
            return Attempted::Dead(format!("refused URL: {refused}"));
        }
        let secrets = match signing_secrets_of(&self.secret, &endpoint) {
            Ok(secrets) => secrets,
            Err(error) => return Attempted::Failed(error.to_string(), None),
        };
        // Sealed under a previous server secret: sealed again under the current one, before
        // the previous one is removed (best effort; start-up does it for every endpoint).
        if !self.secret.previous().is_empty()
            && let Err(error) = reseal_endpoint(&self.accounts, &self.secret, &endpoint).await
        {
            tracing::warn!(endpoint = %endpoint_id, %error, "could not seal the endpoint's signing secret under the current server secret");
        }
        let timestamp = OffsetDateTime::now_utc().unix_timestamp();
        let signature = signature_header(&secrets, event_id, timestamp, body.as_bytes());
        let request = self
            .client
            .post(&endpoint.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", event_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .header("idempotency-key", event_id)
            .body(body);
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                if let Some(refused) = refused_address(&error) {
                    return Attempted::Dead(refused.to_string());
                }
                let connect = error.is_connect();
                let text = crate::display::one_line(&anyhow::Error::new(error.without_url()));
                return if connect {
                    Attempted::Failed(format!("connecting: {text}"), None)
                } else {
                    Attempted::Unknown(format!("after sending: {text}"))
                };
            }
        };
        let status = response.status();
        if status.is_success() {
            return Attempted::Sent(status.as_u16());
        }
        if status == reqwest::StatusCode::GONE {
            return Attempted::Gone;
        }
        // The first bytes of the answer only: a receiver may send anything, of any size.
        let head = oncely_outbox::http::read_at_most(response, BODY_CAP)
            .await
            .body;
        let text: String = String::from_utf8_lossy(&head)
            .chars()
            .take(REASON_BODY_CHARS)
            .collect();
        Attempted::Failed(
            format!("HTTP {status}: {}", text.trim()),
            Some(status.as_u16()),
        )
    }
}

/// What one attempt found.
enum Attempted {
    /// 2xx, with its status.
    Sent(u16),
    /// 410 Gone.
    Gone,
    /// Not delivered; try again (the status, if there was an answer).
    Failed(String, Option<u16>),
    /// Perhaps delivered; try again with the same id.
    Unknown(String),
    /// Never deliverable.
    Dead(String),
}

impl<A: Accounts> Handler for WebhookDelivery<A> {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(self.deliver(job))
    }
}

/// The secrets that sign for `endpoint` now, unsealed: its current one, then its previous one
/// while a rotation's grace runs. A previous one that no configured server secret opens (it was
/// sealed under a server secret rotated out since) is left out, with a warning: the current one
/// still signs.
pub fn signing_secrets_of(
    secret: &ServerSecret,
    endpoint: &EndpointRecord,
) -> Result<Vec<SigningSecret>, signing::UnsealError> {
    let mut secrets = vec![unseal(secret, endpoint.id, &endpoint.secret_sealed)?];
    if let Some(previous) = &endpoint.previous_secret_sealed {
        match unseal(secret, endpoint.id, previous) {
            Ok(previous) => secrets.push(previous),
            Err(error) => tracing::warn!(
                endpoint = %endpoint.id,
                %error,
                "the endpoint's previous signing secret does not open: only its current one signs"
            ),
        }
    }
    Ok(secrets)
}

/// Seals again, under the current server secret, every endpoint's signing secrets that only a
/// previous server secret (`ONCELY_SECRET_PREVIOUS`) opens; returns how many. `serve` and
/// `worker` run it at start, so that once every process runs with the new secret, removing the
/// previous one breaks no endpoint; an endpoint that no configured secret opens is named in a
/// warning. A row rotated
/// meanwhile is left as it is (compare-and-set on the sealed value).
pub async fn reseal_endpoints<A: Accounts>(
    accounts: &A,
    secret: &ServerSecret,
) -> anyhow::Result<usize> {
    let mut resealed = 0;
    for endpoint in accounts.webhook_endpoints(None).await? {
        if signing::unseal(secret, endpoint.id, &endpoint.secret_sealed).is_err() {
            // Sealed under a server secret this process has neither as current nor previous:
            // its deliveries cannot be signed until a process that has it runs.
            tracing::warn!(
                endpoint = %endpoint.id,
                tenant = %endpoint.tenant,
                "no configured server secret opens this webhook endpoint's signing secret: start a process with the secret it was sealed under as ONCELY_SECRET_PREVIOUS, or rotate the endpoint's secret"
            );
            continue;
        }
        resealed += reseal_endpoint(accounts, secret, &endpoint).await?;
    }
    Ok(resealed)
}

/// [`reseal_endpoints`] at a process's start: logs what it did; a failure is logged, not fatal
/// (deliveries re-seal as they go).
pub async fn reseal_at_start<A: Accounts>(accounts: &A, secret: &ServerSecret) {
    match reseal_endpoints(accounts, secret).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            resealed = n,
            "webhook signing secrets sealed under the current server secret"
        ),
        Err(error) => tracing::warn!(
            %error,
            "could not seal the webhook signing secrets under the current server secret"
        ),
    }
}

/// [`reseal_endpoints`] for one endpoint.
async fn reseal_endpoint<A: Accounts>(
    accounts: &A,
    secret: &ServerSecret,
    endpoint: &EndpointRecord,
) -> anyhow::Result<usize> {
    let mut resealed = 0;
    let sealed = std::iter::once(&endpoint.secret_sealed).chain(&endpoint.previous_secret_sealed);
    for old in sealed {
        if let Some(new) = signing::reseal(secret, endpoint.id, old)
            && accounts
                .reseal_webhook_secret(endpoint.id, old, &new)
                .await?
        {
            resealed += 1;
        }
    }
    Ok(resealed)
}

/// Which endpoint (the dev inbox names one by id or by URL).
#[derive(Debug, Clone, Copy)]
pub enum EndpointRef<'a> {
    /// By id.
    Id(Uuid),
    /// Every endpoint with this URL.
    Url(&'a str),
}

/// For the dev inbox's receiver: the current signing secrets (unsealed) of the endpoints
/// `which` names, as `(endpoint id, secrets)`; empty when there is none.
pub async fn signing_secrets<A: Accounts>(
    accounts: &A,
    secret: &ServerSecret,
    which: EndpointRef<'_>,
) -> anyhow::Result<Vec<(Uuid, Vec<SigningSecret>)>> {
    let endpoints = match which {
        EndpointRef::Id(id) => accounts.webhook_endpoint(id).await?.into_iter().collect(),
        EndpointRef::Url(url) => {
            let mut all = accounts.webhook_endpoints(None).await?;
            all.retain(|e| e.url == url);
            all
        }
    };
    endpoints
        .into_iter()
        .map(|e| Ok((e.id, signing_secrets_of(secret, &e)?)))
        .collect()
}
