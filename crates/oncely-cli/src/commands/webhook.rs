//! `oncely tenant webhook add|list|disable|enable|rotate|remove`.

use std::time::Duration;

use anyhow::bail;
use clap::Subcommand;
use oncely_server::accounts::Accounts;
use oncely_server::accounts::EndpointRecord;
use oncely_server::accounts::from_millis;
use oncely_server::backend::COMMAND_POOL;
use oncely_server::display::when;
use serde::Serialize;
use serde_json::json;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::args::DatabaseArgs;
use crate::args::SecretArgs;
use crate::args::WebhookArgs;
use crate::args::parse_duration;
use crate::commands::OperatorArgs;
use crate::commands::outbox::rfc3339;
use crate::output::Failure;
use crate::output::OutputArgs;
use crate::output::clean;
use crate::output::grace_words;
use crate::output::refuse;
use crate::output::render_line;
use crate::output::render_list;

/// `oncely tenant webhook …`: where a tenant's events are delivered (Standard Webhooks).
#[derive(Debug, Subcommand)]
pub enum WebhookCommand {
    /// Add an endpoint and print its id and its signing secret (once: it is stored sealed).
    Add {
        /// The tenant whose events it receives (or `default`).
        name: String,
        /// Where to POST them: absolute http(s), no user info or fragment, at most 2,048 bytes;
        /// in production https and a public address (unless ONCELY_WEBHOOK_ALLOW_PRIVATE).
        url: String,
        /// Only these event types (comma-separated: `user.verified,email.failed`); default:
        /// every event.
        #[arg(long, value_delimiter = ',')]
        events: Vec<String>,
        #[command(flatten)]
        #[allow(missing_docs)]
        secrets: SecretArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        webhooks: WebhookArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// List endpoints: id, tenant, URL, events, enabled or disabled (when, why), created, and
    /// until when a previous secret signs. Never a secret.
    List {
        /// Only this tenant's.
        name: Option<String>,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// Stop delivering to an endpoint: it gets no new events, and its pending deliveries end
    /// dead (re-drive them with `oncely outbox retry` after `enable`).
    Disable {
        /// The endpoint's id.
        id: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// Deliver to a disabled endpoint again (one that answered 410 Gone too).
    Enable {
        /// The endpoint's id.
        id: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// Give an endpoint a new signing secret and print it (once). The previous one keeps
    /// signing beside it until the grace ends (one previous secret at a time).
    Rotate {
        /// The endpoint's id.
        id: String,
        /// How long the previous secret keeps signing (`1h`, `30m`, at most `30d`; default
        /// `24h`).
        #[arg(long, value_parser = parse_grace)]
        grace: Option<Duration>,
        #[command(flatten)]
        #[allow(missing_docs)]
        secrets: SecretArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// Delete an endpoint (its pending deliveries end dead).
    Remove {
        /// The endpoint's id.
        id: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
}

/// The default `--grace` of `tenant webhook rotate`.
pub const WEBHOOK_GRACE: Duration = Duration::from_secs(24 * 3600);

impl WebhookCommand {
    /// Where the endpoints are, and how it prints.
    pub fn operator(&self) -> &OperatorArgs {
        match self {
            Self::Add { operator, .. }
            | Self::List { operator, .. }
            | Self::Disable { operator, .. }
            | Self::Enable { operator, .. }
            | Self::Rotate { operator, .. }
            | Self::Remove { operator, .. } => operator,
        }
    }

    /// Where the endpoints are.
    pub fn database(&self) -> &DatabaseArgs {
        &self.operator().database
    }

    /// How it prints.
    pub fn output(&self) -> OutputArgs {
        self.operator().output
    }
}

/// The longest `--grace` of a key rotation: a rotation is for a key that leaked or is lost.
pub const MAX_GRACE: Duration = Duration::from_secs(30 * 24 * 3600);

pub(crate) fn parse_grace(s: &str) -> Result<Duration, String> {
    let grace = parse_duration(s)?;
    if grace > MAX_GRACE {
        return Err("at most 30d: the old key must stop working soon".into());
    }
    Ok(grace)
}

/// An endpoint in `tenant webhook list --json` (never a secret).
#[derive(Debug, Serialize)]
pub struct EndpointView {
    /// Its id: `disable`, `enable`, `rotate` and `remove` take it.
    pub id: Uuid,
    /// The tenant whose events it receives.
    pub tenant: String,
    /// Where they are POSTed.
    pub url: String,
    /// The event types it receives; empty: every event.
    pub events: Vec<String>,
    /// Whether it receives events.
    pub enabled: bool,
    /// When it was disabled, if it is.
    #[serde(with = "time::serde::rfc3339::option")]
    pub disabled_at: Option<OffsetDateTime>,
    /// Why: `disabled by an operator`, or `410 Gone at …`.
    pub disabled_reason: Option<String>,
    /// When it was added.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Until when its previous signing secret signs too (after `rotate`), while it does.
    #[serde(with = "time::serde::rfc3339::option")]
    pub previous_secret_valid_until: Option<OffsetDateTime>,
}

impl From<EndpointRecord> for EndpointView {
    fn from(e: EndpointRecord) -> Self {
        Self {
            id: e.id,
            tenant: e.tenant,
            url: e.url,
            events: serde_json::from_str(&e.events).unwrap_or_default(),
            enabled: e.disabled_at_ms.is_none(),
            disabled_at: e.disabled_at_ms.map(from_millis),
            disabled_reason: e.disabled_reason,
            created_at: from_millis(e.created_at_ms),
            previous_secret_valid_until: e.previous_secret_expires_at_ms.map(from_millis),
        }
    }
}

/// The reason `tenant webhook disable` records.
pub const DISABLED_BY_OPERATOR: &str = "disabled by an operator";

/// The event types of `--events`, checked, as the stored JSON array (`[]`: every event, when
/// `--events` is not given; given, it must name at least one).
pub fn webhook_events(events: &[String]) -> anyhow::Result<String> {
    use oncely_server::webhooks::EventType;
    let mut types: Vec<&str> = Vec::new();
    for name in events.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let Some(kind) = EventType::parse(name) else {
            let valid: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
            bail!(
                "unknown event type {:?}; the event types are: {}",
                clean(name),
                valid.join(", ")
            );
        };
        if !types.contains(&kind.as_str()) {
            types.push(kind.as_str());
        }
    }
    // An empty `--events ""` (an unset shell variable) is not "every event": that would include
    // email.requested, which carries full addresses and links.
    if !events.is_empty() && types.is_empty() {
        bail!("--events names no event type; leave --events out for every event");
    }
    Ok(serde_json::to_string(&types)?)
}

/// An endpoint id from the command line; a malformed one is not found (exit 3).
pub(crate) fn endpoint_id(id: &str) -> anyhow::Result<Uuid> {
    id.trim().parse().map_err(|_| no_endpoint(id))
}

pub(crate) fn no_endpoint(id: &str) -> anyhow::Error {
    refuse(
        Failure::NotFound,
        format!(
            "no webhook endpoint {} (`oncely tenant webhook list` shows them)",
            clean(id)
        ),
    )
}

/// `oncely tenant webhook add|list|disable|enable|rotate|remove` on backend `B`: what to print.
pub async fn webhook<B: Accounts>(command: WebhookCommand) -> anyhow::Result<String> {
    use oncely_server::secret::signing::{SigningSecret, seal};
    let output = command.output();
    // Checked before anything connects.
    let (tenant, events) = match &command {
        WebhookCommand::Add {
            name,
            events,
            url,
            webhooks,
            secrets,
            ..
        } => {
            let tenant = oncely::TenantId::parse(name).map_err(|e| anyhow::anyhow!("{e}"))?;
            webhooks
                .policy(secrets.environment)
                .allow_resolved(url)
                .await
                .map_err(|e| anyhow::anyhow!("refused webhook URL: {e}"))?;
            (Some(tenant), webhook_events(events)?)
        }
        _ => (None, String::new()),
    };
    let location = command.database().location();
    let backend: B = oncely_server::startup::open_existing(&location, COMMAND_POOL).await?;
    match command {
        WebhookCommand::Add { url, secrets, .. } => {
            let tenant = tenant.expect("parsed above");
            if tenant != oncely::TenantId::default()
                && !backend
                    .tenants()
                    .await?
                    .iter()
                    .any(|t| t.id == tenant.as_str())
            {
                return Err(refuse(
                    Failure::NotFound,
                    format!("no tenant {tenant} (`oncely tenant list` shows them)"),
                ));
            }
            let server = secrets.server_secret(&backend, &location.url).await?;
            let id = Uuid::new_v4();
            let signing = SigningSecret::generate();
            let sealed = seal(&server, id, &signing);
            backend
                .insert_webhook_endpoint(oncely_server::accounts::NewEndpoint {
                    id,
                    tenant: tenant.as_str(),
                    url: &url,
                    events: &events,
                    secret_sealed: &sealed,
                })
                .await?;
            let types: Vec<String> = serde_json::from_str(&events)?;
            let value = json!({
                "id": id,
                "tenant": tenant.as_str(),
                "url": url,
                "events": types,
                "secret": signing.expose(),
            });
            render_line(
                output,
                &value,
                format_args!(
                    "webhook endpoint {id} added: tenant {tenant}'s {} go to {}.\nIts signing secret (shown once; stored sealed):\n{}",
                    if types.is_empty() {
                        "events".to_owned()
                    } else {
                        types.join(", ")
                    },
                    clean(&url),
                    signing.expose()
                ),
            )
        }
        WebhookCommand::List { name, .. } => {
            let endpoints: Vec<EndpointView> = backend
                .webhook_endpoints(name.as_deref())
                .await?
                .into_iter()
                .map(EndpointView::from)
                .collect();
            render_list(
                output,
                &endpoints,
                "no webhook endpoints (`oncely tenant webhook add` adds one)",
                &[
                    "id",
                    "tenant",
                    "events",
                    "state",
                    "created",
                    "previous secret",
                    "url",
                ],
                |e| {
                    vec![
                        e.id.to_string(),
                        e.tenant.clone(),
                        if e.events.is_empty() {
                            "all".into()
                        } else {
                            e.events.join(",")
                        },
                        match (e.disabled_at, &e.disabled_reason) {
                            (None, _) => "enabled".into(),
                            (Some(at), reason) => format!(
                                "disabled {} ({})",
                                when(at),
                                clean(reason.as_deref().unwrap_or(DISABLED_BY_OPERATOR))
                            ),
                        },
                        when(e.created_at),
                        match e.previous_secret_valid_until {
                            Some(until) => format!("until {}", when(until)),
                            None => "-".into(),
                        },
                        clean(&e.url),
                    ]
                },
            )
        }
        WebhookCommand::Disable { id, .. } => {
            let uuid = endpoint_id(&id)?;
            if !backend
                .set_webhook_disabled(uuid, Some(DISABLED_BY_OPERATOR))
                .await?
            {
                return Err(no_endpoint(&id));
            }
            let value = json!({ "id": uuid, "enabled": false });
            render_line(
                output,
                &value,
                format_args!(
                    "webhook endpoint {uuid} disabled: it gets no new events, and its pending deliveries end dead"
                ),
            )
        }
        WebhookCommand::Enable { id, .. } => {
            let uuid = endpoint_id(&id)?;
            if !backend.set_webhook_disabled(uuid, None).await? {
                return Err(no_endpoint(&id));
            }
            let value = json!({ "id": uuid, "enabled": true });
            render_line(
                output,
                &value,
                format_args!(
                    "webhook endpoint {uuid} enabled (`oncely outbox retry` re-drives deliveries that went dead meanwhile)"
                ),
            )
        }
        WebhookCommand::Rotate {
            id, grace, secrets, ..
        } => {
            let uuid = endpoint_id(&id)?;
            if backend.webhook_endpoint(uuid).await?.is_none() {
                return Err(no_endpoint(&id));
            }
            let server = secrets.server_secret(&backend, &location.url).await?;
            let signing = SigningSecret::generate();
            let sealed = seal(&server, uuid, &signing);
            let grace = grace.unwrap_or(WEBHOOK_GRACE);
            let Some(rotated) = backend.rotate_webhook_secret(uuid, &sealed, grace).await? else {
                return Err(no_endpoint(&id));
            };
            let until = rotated.previous_valid_until;
            let value = json!({
                "id": uuid,
                "secret": signing.expose(),
                "previous_secret_valid_until": until.map(rfc3339),
            });
            let old = grace_words(until, "keeps signing beside it", "no longer signs");
            render_line(
                output,
                &value,
                format_args!(
                    "webhook endpoint {uuid} has a new signing secret; the previous one {old}. The new secret (shown once; stored sealed):\n{}",
                    signing.expose()
                ),
            )
        }
        WebhookCommand::Remove { id, .. } => {
            let uuid = endpoint_id(&id)?;
            if !backend.remove_webhook_endpoint(uuid).await? {
                return Err(no_endpoint(&id));
            }
            let value = json!({ "id": uuid, "removed": true });
            render_line(
                output,
                &value,
                format_args!("webhook endpoint {uuid} removed (its pending deliveries end dead)"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (review of issue 17): `--events ""` (an unset shell variable) subscribed the
    /// endpoint to every event, email.requested's addresses and links included.
    #[test]
    fn events_given_must_name_an_event_type() {
        let list = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(webhook_events(&[]).unwrap(), "[]", "not given: every event");
        assert!(webhook_events(&list(&[""])).is_err());
        assert!(webhook_events(&list(&["", " "])).is_err());
        assert_eq!(
            webhook_events(&list(&["user.created", "", "user.created"])).unwrap(),
            r#"["user.created"]"#
        );
        assert!(webhook_events(&list(&["user.deleted"])).is_err());
    }
}
