//! The step every mail-sending route shares: count the email against the rate limits, store a
//! token (or a decoy), enqueue the email job. The same statements run whether or not the
//! address has an account, whether or not the email will be suppressed: responses and their
//! timing cannot tell those cases apart.

use std::net::IpAddr;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use oncely::TenantId;
use oncely_outbox::{JobStore, NewJob};
use serde_json::json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::AppState;
use crate::accounts::{Accounts, NewToken};
use crate::client_addr::{self, TrustedProxies};
use crate::email::EmailAddress;
use crate::token::{Flow, Token};

/// Caps on emails per window, per normalized address and per client.
#[derive(Debug, Clone, Copy)]
pub struct MailLimits {
    /// Emails per window to one address requested by one client (whether or not the address
    /// has an account). A client whose address is unknown counts only against the total.
    pub per_address: u32,
    /// Emails per window to one address from all clients together.
    pub per_address_total: u32,
    /// Emails per window requested by one client address.
    pub per_client: u32,
    /// The window.
    pub window: Duration,
}

/// The client's address, for per-client limits: the connection's peer, or what a trusted proxy
/// forwarded (see [`crate::client_addr`]). `None` when the server runs without connect info:
/// such a request is not counted against any client (it is never pooled with others).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAddr(pub Option<IpAddr>);

impl ClientAddr {
    /// The key of this client's share of the password-hashing pool (its rate-limit bucket).
    pub fn hash_share(&self) -> Option<String> {
        self.0.map(client_addr::cap_bucket)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let trusted = parts
            .extensions
            .get::<TrustedProxies>()
            .cloned()
            .unwrap_or_default();
        Ok(Self(client_addr::client_ip(
            client_addr::peer(&parts.extensions),
            &parts.headers,
            &trusted,
        )))
    }
}

/// Who a token is for.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    /// The account, if there is one.
    pub user: Option<Uuid>,
    /// The invited address (invites only).
    pub email: Option<&'a str>,
}

impl Owner<'_> {
    /// Nobody: the decoy written for an address without an account.
    pub const NOBODY: Self = Self {
        user: None,
        email: None,
    };
}

/// A verification token issued by a signup. It supersedes no other token — each signup's link
/// stays its own, so a stranger's signup cannot kill the owner's link — and the password it
/// carries takes effect only if whoever verifies re-enters it.
#[derive(Debug, Clone, Copy, Default)]
pub struct FromSignup<'a> {
    /// The Argon2id hash of the password the signup chose, if any.
    pub password_hash: Option<&'a str>,
}

/// Counts this email for the address from this client and for this client (whenever the client
/// is known), then — if those let it through — for the address from all clients, and says
/// whether it must be suppressed, and why. The per-address cap is per client: a stranger who
/// exhausts it for the owner's address exhausts it only for itself; the total ceiling needs
/// many clients. (Which counters a request touches depends on the client's own history, never
/// on whether the address has an account.)
pub async fn suppression<A: Accounts>(
    conn: &mut <A::Database as sqlx::Database>::Connection,
    state: &AppState<A>,
    tenant: &TenantId,
    email: &EmailAddress,
    client: &ClientAddr,
) -> anyhow::Result<Option<String>> {
    let limits = state.limits;
    let window = limits.window.as_secs().max(1) as i64;
    let window_start = OffsetDateTime::now_utc().unix_timestamp() / window * window;
    // Buckets are keyed hashes: the limits table never holds an address.
    let bucket = |kind: &str, value: &str| {
        format!(
            "{kind}:{}",
            hex::encode(
                &state
                    .secret
                    .mac("oncely/rate-limit/v1", &[kind.as_bytes(), value.as_bytes()])[..16]
            )
        )
    };
    let (to_address_from_client, from_client) = match client.0 {
        Some(ip) => {
            let client = client_addr::cap_bucket(ip);
            let pair = format!("{}\n{client}", email.as_str());
            let to_address_from_client = A::count_email(
                conn,
                tenant.as_str(),
                &bucket("address-client", &pair),
                window_start,
            )
            .await?;
            let from_client = A::count_email(
                conn,
                tenant.as_str(),
                &bucket("client", &client),
                window_start,
            )
            .await?;
            (to_address_from_client, from_client)
        }
        None => (0, 0),
    };
    let reason = if to_address_from_client > i64::from(limits.per_address) {
        Some((
            "address",
            format!(
                "suppressed: over {} emails per {:?} to this address",
                limits.per_address, limits.window
            ),
        ))
    } else if from_client > i64::from(limits.per_client) {
        Some((
            "client",
            format!(
                "suppressed: over {} emails per {:?} from this client",
                limits.per_client, limits.window
            ),
        ))
    } else {
        // Only emails a client's own caps let through count toward the mailbox's total: a
        // client hammering one address past its share cannot use up everyone else's. And a
        // client's first email to the address in the window always passes the total: however
        // many clients fill it, the owner (a client that has asked for nothing yet) still gets
        // its link — a mail bomb gains one email per client address it controls, no more.
        let to_address = A::count_email(
            conn,
            tenant.as_str(),
            &bucket("address", email.as_str()),
            window_start,
        )
        .await?;
        let first_from_client = to_address_from_client == 1;
        (to_address > i64::from(limits.per_address_total) && !first_from_client).then(|| {
            (
                "address_total",
                format!(
                    "suppressed: over {} emails per {:?} to this address from all clients",
                    limits.per_address_total, limits.window
                ),
            )
        })
    };
    Ok(reason.map(|(limit, reason)| {
        metrics::counter!("oncely_emails_suppressed_total", "limit" => limit).increment(1);
        reason
    }))
}

/// Stores a token of `flow` for `owner` (a decoy if nobody) and enqueues its email job. A token
/// that is not from a signup supersedes the owner's live tokens of the flow (unless its email is
/// suppressed: then the current link must keep working).
pub async fn token_email<A: Accounts>(
    conn: &mut <A::Database as sqlx::Database>::Connection,
    state: &AppState<A>,
    tenant: &TenantId,
    flow: Flow,
    owner: Owner<'_>,
    suppressed: Option<String>,
    signup: Option<FromSignup<'_>>,
) -> anyhow::Result<()> {
    let token_id = Uuid::new_v4();
    let expires_at = OffsetDateTime::now_utc() + flow.lifetime();
    let hash = Token::derive(&state.secret, flow, token_id).hash();
    let token = NewToken {
        id: token_id,
        tenant: tenant.as_str(),
        user_id: owner.user,
        email: owner.email,
        flow: flow.as_str(),
        hash: &hash,
        expires_at,
        password_hash: signup.and_then(|s| s.password_hash),
        supersede: suppressed.is_none() && signup.is_none(),
    };
    A::insert_token(conn, &token).await?;
    let user = owner
        .user
        .map_or_else(|| "no-account".to_owned(), |u| u.to_string());
    let job = NewJob::new(
        format!("{}:{tenant}:{user}:{token_id}", flow.as_str()),
        flow.job_kind(),
        json!({ "token_id": token_id, "suppressed": suppressed }),
    )
    .not_after(expires_at);
    state.jobs.enqueue(conn, &job).await?;
    Ok(())
}
