//! Email verification: `GET /v1/verify` shows a page and consumes nothing (link scanners open
//! links); `POST /v1/verify` consumes the token once.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Html;
use axum::{Extension, Json};
use oncely::{IdempotentTx, Problem, TenantId};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AppState, Body, unexpected};
use crate::accounts::Accounts;
use crate::token::{self, Flow};

/// `?token=` of the link.
#[derive(Deserialize)]
pub struct PageQuery {
    token: Option<String>,
}

/// A confirm page whose button POSTs the token (with an Idempotency-Key, so a double click is
/// harmless). Nothing is read or written here.
pub async fn page(Query(query): Query<PageQuery>) -> Html<String> {
    let token: String = query
        .token
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    Html(format!(
        r#"<!doctype html><meta charset="utf-8"><title>Confirm your email</title>
<h1>Confirm your email address</h1>
<button id="confirm">Confirm</button><p id="result"></p>
<script>
const key = crypto.randomUUID();
document.getElementById("confirm").onclick = async () => {{
  const r = await fetch("/v1/verify", {{method: "POST", headers: {{"content-type": "application/json", "idempotency-key": key}},
    body: JSON.stringify({{token: "{token}"}})}});
  document.getElementById("result").textContent = r.ok ? "Your address is confirmed." : "This link is invalid or has expired.";
}};
</script>"#
    ))
}

/// The verification request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyRequest {
    token: String,
}

/// 400 for every token that does not work: unknown, used, superseded, expired, another tenant's.
pub fn token_invalid() -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "token-invalid",
        "Invalid or expired link",
    )
    .with_detail("the link is invalid, was already used, or has expired; request a new one")
}

/// Consumes a verification token and marks the address verified.
pub async fn verify<A: Accounts>(
    State(_state): State<AppState<A>>,
    tenant: Option<Extension<TenantId>>,
    tx: IdempotentTx<A::Database>,
    Body(request): Body<VerifyRequest>,
) -> Result<Json<Value>, Problem> {
    let tenant = tenant.map(|Extension(t)| t).unwrap_or_default();
    let hash = token::hash(&request.token);
    let mut conn = tx.lock().await;
    let user = A::consume_token(
        &mut conn,
        tenant.as_str(),
        Flow::Verification.as_str(),
        &hash,
    )
    .await
    .map_err(unexpected)?
    .ok_or_else(token_invalid)?;
    A::mark_verified(&mut conn, user)
        .await
        .map_err(unexpected)?;
    Ok(Json(json!({ "status": "verified" })))
}
