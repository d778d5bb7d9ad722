//! The routes that use a link: each token works once, in its own flow and tenant, before it
//! expires; every failure is the same generic 400. Opening a link (GET) shows a page and
//! consumes nothing — link scanners open links; only the page's button POSTs.

use axum::Json;
use axum::extract::{Query, State};
use axum::response::Html;
use oncely::{IdempotentTx, TenantId};
use serde::Deserialize;
use serde_json::{Value, json};

use secrecy::SecretString;

use super::AppState;
use super::error::ApiError;
use super::json_body::JsonBody;
use super::signup::hash_password;
use super::tenants::ProvenTenant;
use crate::accounts::{Accounts, ConsumedToken};
use crate::client_addr::CallerAddr;
use crate::password;
use crate::token::{self, Flow};

/// `?token=` of a link.
#[derive(Deserialize)]
pub struct PageQuery {
    token: Option<String>,
}

/// A page whose button POSTs the token (and a password, where the flow takes one) with an
/// Idempotency-Key, so that a double click is harmless. Reads and writes nothing.
fn page(title: &str, flow: Flow, password_label: Option<&str>, query: PageQuery) -> Html<String> {
    let token: String = query
        .token
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    let password = password_label.map_or_else(String::new, |label| {
        format!(r#"<p><label>{label} <input id="password" type="password" minlength="8" maxlength="128"></label></p>"#)
    });
    let action = flow.path();
    Html(format!(
        r#"<!doctype html><meta charset="utf-8"><title>{title}</title>
<h1>{title}</h1>{password}
<button id="confirm">Confirm</button><p id="result"></p>
<script>
const key = crypto.randomUUID();
document.getElementById("confirm").onclick = async () => {{
  const body = {{token: "{token}"}};
  const field = document.getElementById("password");
  if (field && field.value) body.password = field.value;
  const r = await fetch("{action}", {{method: "POST", headers: {{"content-type": "application/json", "idempotency-key": key}}, body: JSON.stringify(body)}});
  const problem = r.ok ? null : await r.json().catch(() => null);
  document.getElementById("result").textContent = r.ok ? "Done."
    : problem && problem.type && /\/(password-mismatch|invalid-request|busy)$/.test(problem.type) ? problem.detail
    : "This link is invalid or has expired.";
}};
</script>"#
    ))
}

/// `GET /v1/verify`.
pub async fn verify_page(Query(query): Query<PageQuery>) -> Html<String> {
    page(
        "Confirm your email address",
        Flow::Verification,
        Some("The password you chose when you signed up (leave empty if you chose none)"),
        query,
    )
}

/// `GET /v1/password-reset/confirm`.
pub async fn reset_page(Query(query): Query<PageQuery>) -> Html<String> {
    page(
        "Choose a new password",
        Flow::PasswordReset,
        Some("New password"),
        query,
    )
}

/// `GET /v1/magic-link/consume`.
pub async fn magic_page(Query(query): Query<PageQuery>) -> Html<String> {
    page("Sign in", Flow::MagicLink, None, query)
}

/// `GET /v1/invites/accept`.
pub async fn invite_page(Query(query): Query<PageQuery>) -> Html<String> {
    page(
        "Accept the invitation",
        Flow::Invite,
        Some("Password (optional)"),
        query,
    )
}

/// `{ "token": … }` (and a password where the flow takes one).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// The token from the link.
    token: String,
    /// Password reset: the new password (required). Invite: the account's password (optional).
    /// Verification: the password chosen at signup, re-entered to adopt it (optional). Magic
    /// link: none.
    password: Option<String>,
}

/// Consumes `presented` in `flow`. The token names its tenant; a request that proved a tenant
/// with an API key (`proven`) can only use that tenant's tokens.
async fn consume<A: Accounts>(
    conn: &mut <A::Database as sqlx::Database>::Connection,
    proven: &ProvenTenant,
    flow: Flow,
    presented: &str,
) -> Result<ConsumedToken, ApiError> {
    A::consume_token(
        conn,
        proven.0.as_ref().map(TenantId::as_str),
        flow.as_str(),
        &token::hash(presented),
    )
    .await?
    .ok_or(ApiError::InvalidToken)
}

type Consumed = Result<Json<Value>, ApiError>;

fn no_password(request: &TokenRequest) -> Result<(), ApiError> {
    match request.password {
        Some(_) => Err(ApiError::invalid_request("this link takes no password")),
        None => Ok(()),
    }
}

/// How often a verification link's signup password may be re-entered.
pub const PASSWORD_ATTEMPTS: i64 = 5;

/// `POST /v1/verify`: marks the address verified. A signup that chose a password stored its
/// hash with this link's token; the account gets that password only if the request re-enters
/// it — whoever proves the address never adopts a password someone else chose (an attacker who
/// pre-registered the address). Without a password the address is verified and the account
/// keeps no password (set one with a password reset).
pub async fn verify<A: Accounts>(
    State(state): State<AppState<A>>,
    proven: ProvenTenant,
    caller: CallerAddr,
    tx: IdempotentTx<A::Database>,
    JsonBody(request): JsonBody<TokenRequest>,
) -> Consumed {
    let tenant = proven.0.as_ref().map(TenantId::as_str);
    // A re-entered password is checked before the transaction opens: Argon2 takes tens of
    // milliseconds, and the key's transaction (on SQLite the write lock) is not held meanwhile.
    let adopted = match request.password {
        None => None,
        Some(presented) => {
            let (stored, attempts) = state
                .accounts
                .signup_password_attempt(tenant, &token::hash(&request.token))
                .await?
                .ok_or(ApiError::InvalidToken)?;
            let stored = stored.ok_or_else(|| {
                ApiError::invalid_request("this signup chose no password; confirm without one")
            })?;
            // Whoever sees the link (a mail scanner, a log) must not guess the password online.
            if attempts > PASSWORD_ATTEMPTS {
                return Err(ApiError::invalid_request(
                    "too many wrong passwords for this link; confirm without a password, then set one with a password reset",
                ));
            }
            let share = caller.bucket();
            let matches =
                password::verify(share.as_deref(), &stored, SecretString::from(presented)).await?;
            if !matches {
                return Err(ApiError::PasswordMismatch);
            }
            Some(stored)
        }
    };
    let mut conn = tx.lock().await?;
    let token = consume::<A>(&mut *conn, &proven, Flow::Verification, &request.token).await?;
    let user = token.user_id.ok_or(ApiError::InvalidToken)?;
    if adopted.is_some() && token.password_hash != adopted {
        return Err(ApiError::InvalidToken);
    }
    A::mark_verified(&mut conn, user, adopted.as_deref()).await?;
    Ok(Json(
        json!({ "status": "verified", "password_set": adopted.is_some() }),
    ))
}

/// `POST /v1/password-reset/confirm`: sets the new password (and, since the link proved the
/// address, marks it verified).
pub async fn reset_confirm<A: Accounts>(
    State(_): State<AppState<A>>,
    proven: ProvenTenant,
    caller: CallerAddr,
    tx: IdempotentTx<A::Database>,
    JsonBody(request): JsonBody<TokenRequest>,
) -> Consumed {
    let Some(password_hash) = hash_password(request.password, &caller).await? else {
        return Err(ApiError::invalid_request("password is required"));
    };
    let mut conn = tx.lock().await?;
    let token = consume::<A>(&mut *conn, &proven, Flow::PasswordReset, &request.token).await?;
    let user = token.user_id.ok_or(ApiError::InvalidToken)?;
    A::mark_verified(&mut conn, user, None).await?;
    A::set_password(&mut conn, user, &password_hash).await?;
    Ok(Json(json!({ "status": "password_changed" })))
}

/// `POST /v1/magic-link/consume`: signs in (and marks the address verified; a password a signup
/// left on a verification link is not adopted, and that link stops working).
pub async fn magic_consume<A: Accounts>(
    State(_): State<AppState<A>>,
    proven: ProvenTenant,
    tx: IdempotentTx<A::Database>,
    JsonBody(request): JsonBody<TokenRequest>,
) -> Consumed {
    no_password(&request)?;
    let mut conn = tx.lock().await?;
    let token = consume::<A>(&mut *conn, &proven, Flow::MagicLink, &request.token).await?;
    let user = token.user_id.ok_or(ApiError::InvalidToken)?;
    A::mark_verified(&mut conn, user, None).await?;
    Ok(Json(json!({ "status": "signed_in" })))
}

/// `POST /v1/invites/accept`: creates the account (verified) or joins the existing one; one
/// membership per (tenant, user). The tenant is the invite's own.
pub async fn invite_accept<A: Accounts>(
    State(_): State<AppState<A>>,
    proven: ProvenTenant,
    caller: CallerAddr,
    tx: IdempotentTx<A::Database>,
    JsonBody(request): JsonBody<TokenRequest>,
) -> Consumed {
    let password_hash = hash_password(request.password, &caller).await?;
    let mut conn = tx.lock().await?;
    let token = consume::<A>(&mut *conn, &proven, Flow::Invite, &request.token).await?;
    let email = token.email.ok_or(ApiError::InvalidToken)?;
    A::accept_invite(&mut conn, &token.tenant, &email, password_hash.as_deref()).await?;
    Ok(Json(json!({ "status": "joined" })))
}
