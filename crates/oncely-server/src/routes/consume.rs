//! The routes that use a link: each token works once, in its own flow and tenant, before it
//! expires; every failure is the same generic 400. Opening a link (GET) shows a page and
//! consumes nothing — link scanners open links; only the page's button POSTs.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Html;
use oncely::{IdempotentTx, Problem, TenantId};
use serde::Deserialize;
use serde_json::{Value, json};

use super::signup::hash_password;
use super::tenant::Tenant;
use super::{AppState, Body, unexpected};
use crate::accounts::{Accounts, ConsumedToken};
use crate::token::{self, Flow};

/// `?token=` of a link.
#[derive(Deserialize)]
pub struct PageQuery {
    token: Option<String>,
}

/// A page whose button POSTs the token (and a password, where the flow takes one) with an
/// Idempotency-Key, so that a double click is harmless. Reads and writes nothing.
fn page(title: &str, flow: Flow, with_password: bool, query: PageQuery) -> Html<String> {
    let token: String = query
        .token
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    let password = if with_password {
        r#"<p><label>Password <input id="password" type="password" minlength="8" maxlength="128"></label></p>"#
    } else {
        ""
    };
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
  document.getElementById("result").textContent = r.ok ? "Done." : "This link is invalid or has expired.";
}};
</script>"#
    ))
}

/// `GET /v1/verify`.
pub async fn verify_page(Query(query): Query<PageQuery>) -> Html<String> {
    page(
        "Confirm your email address",
        Flow::Verification,
        false,
        query,
    )
}

/// `GET /v1/password-reset/confirm`.
pub async fn reset_page(Query(query): Query<PageQuery>) -> Html<String> {
    page("Choose a new password", Flow::PasswordReset, true, query)
}

/// `GET /v1/magic-link/consume`.
pub async fn magic_page(Query(query): Query<PageQuery>) -> Html<String> {
    page("Sign in", Flow::MagicLink, false, query)
}

/// `GET /v1/invites/accept`.
pub async fn invite_page(Query(query): Query<PageQuery>) -> Html<String> {
    page("Accept the invitation", Flow::Invite, true, query)
}

/// `{ "token": … }` (and a password where the flow takes one).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// The token from the link.
    token: String,
    /// The new password (password reset: required; invite: optional; others: none).
    password: Option<String>,
}

/// 400 for every token that does not work: unknown, used, superseded, expired, of another
/// flow or another tenant.
pub fn token_invalid() -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "token-invalid",
        "Invalid or expired link",
    )
    .with_detail("the link is invalid, was already used, or has expired; request a new one")
}

async fn consume<A: Accounts>(
    conn: &mut <A::Database as sqlx::Database>::Connection,
    tenant: &TenantId,
    flow: Flow,
    presented: &str,
) -> Result<ConsumedToken, Problem> {
    A::consume_token(
        conn,
        tenant.as_str(),
        flow.as_str(),
        &token::hash(presented),
    )
    .await
    .map_err(unexpected)?
    .ok_or_else(token_invalid)
}

type Consumed = Result<Json<Value>, Problem>;

/// Uses a link whose only effect is proving the address: marks it verified, answers `status`.
async fn verify_address<A: Accounts>(
    tenant: &TenantId,
    tx: &IdempotentTx<A::Database>,
    request: TokenRequest,
    flow: Flow,
    status: &str,
) -> Consumed {
    no_password(&request)?;
    let mut conn = tx.lock().await?;
    let token = consume::<A>(&mut *conn, tenant, flow, &request.token).await?;
    let user = token.user_id.ok_or_else(token_invalid)?;
    A::mark_verified(&mut conn, user)
        .await
        .map_err(unexpected)?;
    Ok(Json(json!({ "status": status })))
}

fn no_password(request: &TokenRequest) -> Result<(), Problem> {
    match request.password {
        Some(_) => Err(super::invalid_request("this link takes no password")),
        None => Ok(()),
    }
}

/// `POST /v1/verify`: marks the address verified.
pub async fn verify<A: Accounts>(
    State(_): State<AppState<A>>,
    Tenant(tenant): Tenant,
    tx: IdempotentTx<A::Database>,
    Body(request): Body<TokenRequest>,
) -> Consumed {
    verify_address::<A>(&tenant, &tx, request, Flow::Verification, "verified").await
}

/// `POST /v1/password-reset/confirm`: sets the new password (and, since the link proved the
/// address, marks it verified).
pub async fn reset_confirm<A: Accounts>(
    State(_): State<AppState<A>>,
    Tenant(tenant): Tenant,
    tx: IdempotentTx<A::Database>,
    Body(request): Body<TokenRequest>,
) -> Consumed {
    let Some(password_hash) = hash_password(request.password).await? else {
        return Err(super::invalid_request("password is required"));
    };
    let mut conn = tx.lock().await?;
    let token = consume::<A>(&mut *conn, &tenant, Flow::PasswordReset, &request.token).await?;
    let user = token.user_id.ok_or_else(token_invalid)?;
    A::set_password(&mut conn, user, &password_hash)
        .await
        .map_err(unexpected)?;
    A::mark_verified(&mut conn, user)
        .await
        .map_err(unexpected)?;
    Ok(Json(json!({ "status": "password_changed" })))
}

/// `POST /v1/magic-link/consume`: signs in (and marks the address verified).
pub async fn magic_consume<A: Accounts>(
    State(_): State<AppState<A>>,
    Tenant(tenant): Tenant,
    tx: IdempotentTx<A::Database>,
    Body(request): Body<TokenRequest>,
) -> Consumed {
    verify_address::<A>(&tenant, &tx, request, Flow::MagicLink, "signed_in").await
}

/// `POST /v1/invites/accept`: creates the account (verified) or joins the existing one; one
/// membership per (tenant, user).
pub async fn invite_accept<A: Accounts>(
    State(_): State<AppState<A>>,
    Tenant(tenant): Tenant,
    tx: IdempotentTx<A::Database>,
    Body(request): Body<TokenRequest>,
) -> Consumed {
    let password_hash = hash_password(request.password).await?;
    let mut conn = tx.lock().await?;
    let token = consume::<A>(&mut *conn, &tenant, Flow::Invite, &request.token).await?;
    let email = token.email.ok_or_else(token_invalid)?;
    A::accept_invite(&mut conn, tenant.as_str(), &email, password_hash.as_deref())
        .await
        .map_err(unexpected)?;
    Ok(Json(json!({ "status": "joined" })))
}
