//! `POST /v1/signup`: one account per (tenant, address), one email per request.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use oncely::{IdempotentTx, Problem};
use oncely_outbox::{JobStore, NewJob};
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::json;

use super::issue::{ClientAddr, FromSignup, Owner, suppression, token_email};
use super::tenant::Tenant;
use super::{AppState, Body, accepted, invalid_request, unexpected};
use crate::accounts::{Accounts, SignupRow};
use crate::email::EmailAddress;
use crate::mail::SIGNUP_NOTICE;
use crate::password;
use crate::token::Flow;

/// The signup request.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignupRequest {
    /// The address; normalized (trimmed, IDNA, lower case) and strictly validated.
    #[schema(example = "ada@example.com")]
    email: String,
    /// Optional; 8–128 characters.
    password: Option<String>,
    /// Optional; where the signup came from, ≤ 64 printable characters.
    source: Option<String>,
}

/// Checks a password's length and hashes it (before any database work, for every request
/// that has one, whatever the address), within the caller's share of the hashing pool.
pub async fn hash_password(
    password: Option<String>,
    client: &ClientAddr,
) -> Result<Option<String>, Problem> {
    match password {
        Some(password) if !password::LENGTH.contains(&password.chars().count()) => {
            Err(invalid_request("password must be 8 to 128 characters"))
        }
        Some(password) => {
            let client = client.hash_share();
            let hashed =
                password::hash_for(client.as_deref(), SecretString::from(password)).await?;
            Ok(Some(hashed))
        }
        None => Ok(None),
    }
}

impl From<password::HashError> for Problem {
    fn from(error: password::HashError) -> Self {
        match error {
            password::HashError::Overloaded => busy(),
            password::HashError::Failed(error) => unexpected(error),
        }
    }
}

/// 503 while every password hasher is busy: nothing ran, the key is free, retry shortly.
fn busy() -> Problem {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "busy",
        "Too many passwords being hashed",
    )
    .with_detail("nothing was changed; retry with the same Idempotency-Key after Retry-After")
    .with_retry_after(password::RETRY_AFTER_SECONDS)
}

/// Creates the account (or finds it), and the email for it — a verification link, or a notice
/// to an account that exists — in the idempotency layer's transaction: they commit with the
/// stored response, once.
pub async fn signup<A: Accounts>(
    State(state): State<AppState<A>>,
    Tenant(tenant): Tenant,
    client: ClientAddr,
    tx: IdempotentTx<A::Database>,
    Body(request): Body<SignupRequest>,
) -> Result<(StatusCode, Json<serde_json::Value>), Problem> {
    let email = EmailAddress::parse(&request.email)
        .map_err(|_| invalid_request("email is not a valid address"))?;
    if let Some(source) = &request.source
        && (source.len() > 64 || source.chars().any(char::is_control))
    {
        return Err(invalid_request("source is at most 64 printable characters"));
    }
    let password_hash = hash_password(request.password, &client).await?;

    let mut conn = tx.lock().await?;
    let row = A::signup_user(
        &mut conn,
        tenant.as_str(),
        &email,
        request.source.as_deref(),
    )
    .await
    .map_err(unexpected)?;
    let suppressed = suppression(&mut *conn, &state, &tenant, &email, &client)
        .await
        .map_err(unexpected)?;
    match row {
        SignupRow::Created(user) | SignupRow::Pending(user) => {
            let owner = Owner {
                user: Some(user),
                email: None,
            };
            // The password waits on this signup's own token: the account gets it only when
            // the address owner verifies with this link and re-enters it.
            let signup = FromSignup {
                password_hash: password_hash.as_deref(),
            };
            token_email(
                &mut *conn,
                &state,
                &tenant,
                Flow::Verification,
                owner,
                suppressed,
                Some(signup),
            )
            .await
            .map_err(unexpected)?;
        }
        SignupRow::Verified(user) => {
            // A decoy token keeps the work the same as for a new address; the email is a notice.
            token_email(
                &mut *conn,
                &state,
                &tenant,
                Flow::Verification,
                Owner::NOBODY,
                Some("decoy".into()),
                Some(FromSignup::default()),
            )
            .await
            .map_err(unexpected)?;
            let job = NewJob::new(
                format!("signup-notice:{tenant}:{user}:{}", tx.derived_key()),
                SIGNUP_NOTICE,
                json!({ "user_id": user, "suppressed": suppressed }),
            );
            state
                .jobs
                .enqueue(&mut conn, &job)
                .await
                .map_err(|e| unexpected(e.into()))?;
        }
    }
    tracing::info!(email = %email.masked(), tenant = %tenant, "signup accepted");
    Ok(accepted())
}
