//! `POST /v1/signup`: one account per (tenant, address), one email per request.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use oncely::IdempotentTx;
use oncely_outbox::NewJob;
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::json;

use super::email_caps::{FromSignup, Owner, suppression, token_email};
use super::error::ApiError;
use super::json_body::JsonBody;
use super::tenants::Tenant;
use super::{AppState, accepted};
use crate::accounts::{Accounts, SignupRow};
use crate::client_addr::CallerAddr;
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
    caller: &CallerAddr,
) -> Result<Option<String>, ApiError> {
    match password {
        Some(password) if !password::LENGTH.contains(&password.chars().count()) => Err(
            ApiError::invalid_request("password must be 8 to 128 characters"),
        ),
        Some(password) => {
            let share = caller.bucket();
            let hashed = password::hash_for(share.as_deref(), SecretString::from(password)).await?;
            Ok(Some(hashed))
        }
        None => Ok(None),
    }
}

/// Creates the account (or finds it), and the email for it — a verification link, or a notice
/// to an account that exists — in the idempotency layer's transaction: they commit with the
/// stored response, once.
pub async fn signup<A: Accounts>(
    State(state): State<AppState<A>>,
    Tenant(tenant): Tenant,
    caller: CallerAddr,
    tx: IdempotentTx<A::Database>,
    JsonBody(request): JsonBody<SignupRequest>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let email = EmailAddress::parse(&request.email)
        .map_err(|_| ApiError::invalid_request("email is not a valid address"))?;
    if let Some(source) = &request.source
        && (source.len() > 64 || source.chars().any(char::is_control))
    {
        return Err(ApiError::invalid_request(
            "source is at most 64 printable characters",
        ));
    }
    let password_hash = hash_password(request.password, &caller).await?;

    let mut conn = tx.lock().await?;
    let row = A::signup_user(
        &mut conn,
        tenant.as_str(),
        &email,
        request.source.as_deref(),
    )
    .await?;
    let suppressed = suppression(&mut *conn, &state, &tenant, &email, &caller).await?;
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
            .await?;
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
            .await?;
            let job = NewJob::new(
                format!("signup-notice:{tenant}:{user}:{}", tx.derived_key()),
                SIGNUP_NOTICE,
                json!({ "user_id": user, "suppressed": suppressed }),
            );
            A::enqueue(&mut conn, &job).await?;
        }
    }
    tracing::info!(email = %email.masked(), tenant = %tenant, "signup accepted");
    Ok(accepted())
}
