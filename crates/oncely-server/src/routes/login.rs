//! `POST /v1/login`: the application's backend checks a password (tenant API key required) and
//! gets the [`Identity`]. Every failure is one answer (401 `login-failed`) that costs one Argon2
//! check whatever the reason; failures are counted in the database (per address from one
//! client, per address, per client) and past a limit the next attempts are refused (429) before
//! any password is checked, the same way for addresses with and without an account.
//!
//! The check is [`authenticate`], a middleware in front of the idempotency layer: it runs for
//! every request, a retry under the same Idempotency-Key included, so that a key reused with
//! other passwords is no way around the count, and a replay never hands out an identity that a
//! check now would refuse (a password changed since, an account gone). The layer fingerprints
//! what was proved, not what was sent ([`proved`]): the address and the account, never the
//! password — a repeat is the same login when its password proves the same account now (the
//! address's next owner, after an email change, is another login: 422). With a key, a retry
//! replays the identity (its
//! `authenticated_at` and event are the first request's); without one, each request runs. The
//! counters and a re-hashed password are written in statements of their own. A success writes
//! its `user.signed_in` event (`method: password`) in the layer's transaction, with the key's
//! claim (a concurrent retry that claimed the key first answers from it, and this request
//! writes nothing), or without a key in a transaction of its own.

use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use oncely::{IdempotentTx, TenantId};
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::AppState;
use super::account_events::{SignInMethod, account_event};
use super::error::ApiError;
use super::exchange::without_email;
use super::post::peek_json;
use super::tenants::Tenant;
use crate::accounts::{AccountError, Accounts};
use crate::client_addr::CallerAddr;
use crate::email::EmailAddress;
use crate::identity::{self, Identity, Proof};
use crate::limits::{HARD_CEILING, bucket};
use crate::password::{self, Verified};
use crate::webhooks::EventType;

/// The login request.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// The address (normalized as at signup).
    #[schema(example = "ada@example.com")]
    email: String,
    /// The password (at most 128 characters, as every password oncely sets).
    password: String,
}

/// The identity [`authenticate`] proved, for the handler.
#[derive(Clone)]
pub struct Authenticated(Identity);

/// Middleware of `POST /v1/login`, in front of the idempotency layer: counts the attempt,
/// refuses it (429) past a limit, and checks the password — for every request, with or without a
/// key, a retry or a repeat under a reused key alike. Only a request whose password checks out
/// now reaches the layer (which replays, or runs [`login`]).
pub async fn authenticate<A: Accounts>(
    State(state): State<AppState<A>>,
    request: Request,
    next: Next,
) -> Response {
    match authenticated(&state, request).await {
        Ok(request) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

/// [`authenticate`]'s check: the request, with the identity it proved, or the answer.
async fn authenticated<A: Accounts>(
    state: &AppState<A>,
    request: Request,
) -> Result<Request, ApiError> {
    let (mut parts, body) = request.into_parts();
    let Ok(tenant) = Tenant::from_request_parts(&mut parts, state).await;
    tenant.require_proven()?;
    // The backend's users' address, named in Oncely-Client-IP (else unknown: only the
    // per-address total applies).
    let caller = CallerAddr::named_by_backend(&parts.headers).map_err(ApiError::invalid_request)?;
    let (request, request_parts): (LoginRequest, _) =
        peek_json(Request::from_parts(parts, body)).await?;
    // No password oncely sets is longer: a longer one cannot match, and is not worth hashing.
    if request.password.chars().count() > *password::LENGTH.end() {
        return Err(ApiError::invalid_request(format!(
            "password must be at most {} characters",
            password::LENGTH.end()
        )));
    }
    let tenant = tenant.id;
    // Any address an account may have (an earlier release took some the mailer cannot send
    // to: a login sends nothing).
    let address = EmailAddress::parse_stored(&request.email).ok();
    // An address that does not parse is throttled under what was sent, as a parsed one is
    // under its normalized form: the answer must not tell them apart.
    let throttled_as = match &address {
        Some(address) => address.as_str().to_owned(),
        None => request.email.trim().to_lowercase(),
    };
    let attempt = match Attempt::start(state, &tenant, &throttled_as, &caller).await {
        Ok(attempt) => attempt,
        Err(error) => {
            if matches!(error, ApiError::LoginThrottled { .. }) {
                metrics::counter!("oncely_logins_total", "outcome" => "throttled").increment(1);
            }
            return Err(error);
        }
    };
    let verified =
        verify_password(state, &tenant, address.as_ref(), request.password, &caller).await;
    let masked = address
        .as_ref()
        .map_or_else(|| "(invalid)".into(), EmailAddress::masked);
    match verified {
        Err(ApiError::LoginFailed) => {
            // The failure stays counted.
            metrics::counter!("oncely_logins_total", "outcome" => "failed").increment(1);
            tracing::info!(email = %masked, tenant = %tenant, "login failed");
            Err(ApiError::LoginFailed)
        }
        Err(error) => {
            // A check that did not happen (busy, an error) is no failure.
            attempt.undo().await;
            Err(error)
        }
        Ok(identity) => {
            attempt.undo().await;
            metrics::counter!("oncely_logins_total", "outcome" => "succeeded").increment(1);
            tracing::info!(email = %masked, tenant = %tenant, "login succeeded");
            let (mut parts, _) = request_parts.into_parts();
            let body = proved(&request.email, &identity);
            parts
                .headers
                .insert(header::CONTENT_LENGTH, body.len().into());
            parts.extensions.insert(Authenticated(identity));
            Ok(Request::from_parts(parts, Body::from(body)))
        }
    }
}

/// The body the idempotency layer gets in place of the login's: what the check proved — the
/// address as sent (normalized by the layer) and the account — never the password. Its
/// fingerprint makes a repeat under the same key the same login only when its password proves
/// the same account now: a key reused after the address moved to another account is a 422,
/// never the earlier account's identity; and no keyed hash of a password is stored with a key.
fn proved(email: &str, identity: &Identity) -> Vec<u8> {
    let body = json!({ "email": email, "user_id": identity.user_id });
    serde_json::to_vec(&body).expect("JSON of a string and a UUID")
}

/// `POST /v1/login`: the identity of the verified account whose password this is — proved by
/// [`authenticate`] in front of the layer; here its `user.signed_in` event is written.
pub async fn login<A: Accounts>(
    State(state): State<AppState<A>>,
    Extension(Authenticated(identity)): Extension<Authenticated>,
    tx: Option<Extension<IdempotentTx<A::Database>>>,
) -> Result<Json<Value>, ApiError> {
    signed_in(&state, tx.as_ref().map(|Extension(tx)| tx), &identity).await?;
    // Stored without the address, like the exchange's identity (added on the way out).
    without_email(identity)
}

/// Writes the `user.signed_in` event of a successful login: in the key's transaction when the
/// request has one (claiming the key: [`ApiError::Conflict`] if a concurrent request with it
/// claimed it first, and the layer answers from it), else in a transaction of its own.
async fn signed_in<A: Accounts>(
    state: &AppState<A>,
    tx: Option<&IdempotentTx<A::Database>>,
    identity: &Identity,
) -> Result<(), ApiError> {
    let (tenant, user, email) = (&identity.tenant, identity.user_id, &identity.email);
    let method = json!({ "method": SignInMethod::Password.as_str() });
    let kind = EventType::UserSignedIn;
    match tx {
        Some(tx) => {
            let mut conn = tx.lock().await?;
            account_event(&mut *conn, state, tenant, kind, user, email, method).await
        }
        None => {
            let mut tx = state
                .accounts
                .db()
                .begin_with(A::BEGIN_WRITE)
                .await
                .map_err(AccountError::of)?;
            account_event(&mut *tx, state, tenant, kind, user, email, method).await?;
            tx.commit().await.map_err(AccountError::of)?;
            Ok(())
        }
    }
}

/// Checks the password against the account's hash, or against the decoy when there is no
/// verified account with a password: one Argon2 check either way. A match on a hash of other
/// parameters stores its new hash (compare-and-set: a concurrent reset wins).
async fn verify_password<A: Accounts>(
    state: &AppState<A>,
    tenant: &TenantId,
    address: Option<&EmailAddress>,
    password: String,
    caller: &CallerAddr,
) -> Result<Identity, ApiError> {
    let user = match address {
        Some(address) => state.accounts.login_user(tenant.as_str(), address).await?,
        None => None,
    };
    // Only a verified account logs in: a signup's password is adopted when its owner verifies.
    let stored = user
        .as_ref()
        .filter(|user| user.verified)
        .and_then(|user| user.password_hash.clone());
    let phc = stored.as_deref().unwrap_or_else(|| password::decoy());
    let share = caller.bucket();
    let verified =
        password::verify_and_rehash(share.as_deref(), phc, SecretString::from(password)).await?;
    let (Some(user), Some(address), Some(old), Verified::Match { rehashed }) =
        (user, address, stored.as_deref(), verified)
    else {
        return Err(ApiError::LoginFailed);
    };
    if let Some(new) = rehashed {
        let replaced = state.accounts.rehash_password(user.id, old, &new).await?;
        tracing::info!(
            user = %user.id,
            replaced,
            "password re-hashed with the current parameters"
        );
    }
    Ok(Identity {
        user_id: user.id,
        email: address.as_str().to_owned(),
        email_verified: true,
        tenant: tenant.as_str().to_owned(),
        flow: Proof::Password,
        authenticated_at: identity::now(),
    })
}

/// One login attempt, counted as a failure before the password is checked (so that
/// concurrent attempts cannot all slip under a limit), and taken back by [`Attempt::undo`] if it
/// turns out not to be one.
struct Attempt<'a, A: Accounts> {
    state: &'a AppState<A>,
    tenant: &'a TenantId,
    window_start: i64,
    /// The buckets counted.
    counted: Vec<String>,
}

impl<'a, A: Accounts> Attempt<'a, A> {
    /// Counts the attempt for the address from this client and for this client (when the
    /// client is known), then — if those let it through — for the address from all clients;
    /// [`ApiError::LoginThrottled`] (counting undone) when one is over its limit. Which counters
    /// it touches depends on the client's own history, never on whether the address has an
    /// account; no address is read.
    async fn start(
        state: &'a AppState<A>,
        tenant: &'a TenantId,
        address: &str,
        caller: &CallerAddr,
    ) -> Result<Self, ApiError> {
        let limits = state.login;
        let window = limits.window.as_secs().max(1) as i64;
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let window_start = now / window * window;
        let mut attempt = Self {
            state,
            tenant,
            window_start,
            counted: Vec::new(),
        };
        let over = |count: i64, limit: u32| count > i64::from(limit);
        let first_from_client = match caller.bucket() {
            Some(client) => {
                let pair = format!("{address}\n{client}");
                let from_client_to_address = attempt.count("login-address-client", &pair).await?;
                let from_client = attempt.count("login-client", &client).await?;
                if over(from_client_to_address, limits.per_address)
                    || over(from_client, limits.per_client)
                {
                    return Err(attempt.refuse(window_start + window - now).await);
                }
                from_client_to_address == 1
            }
            None => false,
        };
        let to_address = attempt.count("login-address", address).await?;
        // A client's first attempt at the address in the window passes the total: strangers
        // who fill it from many clients do not lock the owner out.
        // Not past the hard ceiling, though: clients are cheap (an IPv6 prefix holds thousands,
        // a backend may name any address), so an address takes at most that many guesses.
        let ceiling = i64::from(limits.per_address_total) * HARD_CEILING;
        if to_address > ceiling
            || (over(to_address, limits.per_address_total) && !first_from_client)
        {
            return Err(attempt.refuse(window_start + window - now).await);
        }
        Ok(attempt)
    }

    /// Counts one more in a bucket ([`bucket`]), in a statement of its own.
    async fn count(&mut self, kind: &str, value: &str) -> Result<i64, ApiError> {
        let bucket = bucket(&self.state.secret, kind, value);
        let count = self
            .state
            .accounts
            .count_on_pool(self.tenant.as_str(), &bucket, self.window_start)
            .await?;
        self.counted.push(bucket);
        Ok(count)
    }

    /// The refusal, once this attempt's counts are taken back: a refused attempt checked no
    /// password.
    async fn refuse(self, retry_after: i64) -> ApiError {
        self.undo().await;
        ApiError::LoginThrottled {
            retry_after: retry_after.max(1) as u64,
        }
    }

    /// Takes this attempt's counts back. Best effort: a count left behind only makes a limit
    /// stricter until the window ends.
    async fn undo(self) {
        for bucket in &self.counted {
            let undone = self
                .state
                .accounts
                .uncount(self.tenant.as_str(), bucket, self.window_start)
                .await;
            if let Err(error) = undone {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "a login attempt stayed counted"
                );
            }
        }
    }
}
