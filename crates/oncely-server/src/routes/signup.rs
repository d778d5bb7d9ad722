//! `POST /v1/signup`: one account per (tenant, address), one email per request.

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use oncely::{IdempotentTx, Problem, TenantId};
use oncely_outbox::NewJob;
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{AppState, Body, invalid_request, unexpected};
use crate::accounts::{Accounts, NewToken, SignupRow};
use crate::email::EmailAddress;
use crate::mail::{SIGNUP_NOTICE, VERIFICATION};
use crate::password;
use crate::token::{Flow, Token};

/// The signup request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignupRequest {
    email: String,
    password: Option<String>,
    source: Option<String>,
}

/// The same answer whether the address is new, pending or registered.
pub fn accepted() -> (StatusCode, Json<Value>) {
    (
        StatusCode::ACCEPTED,
        Json(json!({
            "status": "accepted",
            "detail": "If this address can be used, an email with the next step is on its way to it."
        })),
    )
}

/// Creates the account (or finds it), a verification token and the email job, in the
/// idempotency layer's transaction: they commit with the stored response, once.
pub async fn signup<A: Accounts>(
    State(state): State<AppState<A>>,
    tenant: Option<Extension<TenantId>>,
    tx: IdempotentTx<A::Database>,
    Body(request): Body<SignupRequest>,
) -> Result<(StatusCode, Json<Value>), Problem> {
    let tenant = tenant.map(|Extension(t)| t).unwrap_or_default();
    let email = EmailAddress::parse(&request.email)
        .map_err(|_| invalid_request("email is not a valid address"))?;
    if let Some(source) = &request.source
        && (source.len() > 64 || source.chars().any(char::is_control))
    {
        return Err(invalid_request("source is at most 64 printable characters"));
    }
    let password_hash = match request.password {
        Some(password) if !password::LENGTH.contains(&password.chars().count()) => {
            return Err(invalid_request("password must be 8 to 128 characters"));
        }
        Some(password) => Some(
            password::hash(SecretString::from(password))
                .await
                .map_err(unexpected)?,
        ),
        None => None,
    };

    let mut conn = tx.lock().await;
    let row = A::signup_user(
        &mut conn,
        tenant.as_str(),
        &email,
        password_hash.as_deref(),
        request.source.as_deref(),
    )
    .await
    .map_err(unexpected)?;
    let job = match row {
        SignupRow::Created(user_id) | SignupRow::Pending(user_id) => {
            let token_id = Uuid::new_v4();
            let expires_at = OffsetDateTime::now_utc() + Flow::Verification.lifetime();
            let hash = Token::derive(&state.secret, Flow::Verification, token_id).hash();
            let token = NewToken {
                id: token_id,
                tenant: tenant.as_str(),
                user_id,
                flow: Flow::Verification.as_str(),
                hash: &hash,
                expires_at,
            };
            A::insert_token(&mut conn, &token)
                .await
                .map_err(unexpected)?;
            NewJob::new(
                format!("signup-verification:{tenant}:{user_id}:{token_id}"),
                VERIFICATION,
                json!({ "token_id": token_id }),
            )
            .not_after(expires_at)
        }
        SignupRow::Verified(user_id) => NewJob::new(
            format!("signup-notice:{tenant}:{user_id}:{}", tx.derived_key()),
            SIGNUP_NOTICE,
            json!({ "user_id": user_id }),
        ),
    };
    A::enqueue(&mut conn, &job)
        .await
        .map_err(|e| unexpected(e.into()))?;
    tracing::info!(email = %email.masked(), tenant = %tenant, kind = %job.kind, "signup accepted");
    Ok(accepted())
}
