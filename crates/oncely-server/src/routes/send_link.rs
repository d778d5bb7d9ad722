//! The routes that email a link: resend verification, password reset, magic link, invite.
//! Each answers the same 202 whether or not the address has an account (and does the same
//! database work: see [`super::email_caps`]).

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use oncely::{IdempotentTx, TenantId};
use serde::Deserialize;
use serde_json::Value;

use super::email_caps::{Owner, suppression, token_email};
use super::error::ApiError;
use super::json_body::JsonBody;
use super::tenants::{AuthenticatedTenant, Tenant, require};
use super::{AppState, accepted};
use crate::accounts::Accounts;
use crate::client_addr::CallerAddr;
use crate::email::EmailAddress;
use crate::token::Flow;

/// `{ "email": … }`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmailRequest {
    /// The address the link is for.
    #[schema(example = "ada@example.com")]
    email: String,
}

type Accepted = Result<(StatusCode, Json<Value>), ApiError>;

/// Which account a link goes to, for a flow.
#[derive(Clone, Copy)]
enum Target {
    /// Only an account whose address is not verified yet (resend verification).
    Pending,
    /// Any account (reset, magic link).
    Account,
    /// The address itself, with its account if it has one (invites).
    Address,
}

async fn send_link<A: Accounts>(
    state: &AppState<A>,
    tenant: &TenantId,
    caller: &CallerAddr,
    tx: &IdempotentTx<A::Database>,
    email: &str,
    flow: Flow,
    target: Target,
) -> Accepted {
    let email = EmailAddress::parse(email)
        .map_err(|_| ApiError::invalid_request("email is not a valid address"))?;
    let mut conn = tx.lock().await?;
    let user = A::find_user(&mut conn, tenant.as_str(), &email).await?;
    let suppressed = suppression(&mut *conn, state, tenant, &email, caller).await?;
    let owner = match (user, target) {
        (user, Target::Address) => Owner {
            user: user.map(|u| u.id),
            email: Some(email.as_str()),
        },
        (Some(user), Target::Account) => Owner {
            user: Some(user.id),
            email: None,
        },
        (Some(user), Target::Pending) if !user.verified => Owner {
            user: Some(user.id),
            email: None,
        },
        _ => Owner::NOBODY,
    };
    token_email(&mut *conn, state, tenant, flow, owner, suppressed, None).await?;
    tracing::info!(email = %email.masked(), tenant = %tenant, flow = flow.as_str(), "link requested");
    Ok(accepted())
}

/// `POST /v1/verification/resend`: a new verification link (superseding the old one) if the
/// address has an unverified account.
pub async fn resend<A: Accounts>(
    State(state): State<AppState<A>>,
    Tenant(tenant): Tenant,
    caller: CallerAddr,
    tx: IdempotentTx<A::Database>,
    JsonBody(request): JsonBody<EmailRequest>,
) -> Accepted {
    send_link(
        &state,
        &tenant,
        &caller,
        &tx,
        &request.email,
        Flow::Verification,
        Target::Pending,
    )
    .await
}

/// `POST /v1/password-reset`: a reset link (1 h) if the address has an account.
pub async fn password_reset<A: Accounts>(
    State(state): State<AppState<A>>,
    Tenant(tenant): Tenant,
    caller: CallerAddr,
    tx: IdempotentTx<A::Database>,
    JsonBody(request): JsonBody<EmailRequest>,
) -> Accepted {
    send_link(
        &state,
        &tenant,
        &caller,
        &tx,
        &request.email,
        Flow::PasswordReset,
        Target::Account,
    )
    .await
}

/// `POST /v1/magic-link`: a sign-in link (15 min) if the address has an account.
pub async fn magic_link<A: Accounts>(
    State(state): State<AppState<A>>,
    Tenant(tenant): Tenant,
    caller: CallerAddr,
    tx: IdempotentTx<A::Database>,
    JsonBody(request): JsonBody<EmailRequest>,
) -> Accepted {
    send_link(
        &state,
        &tenant,
        &caller,
        &tx,
        &request.email,
        Flow::MagicLink,
        Target::Account,
    )
    .await
}

/// `POST /v1/invites` (tenant API key required): an invitation (7 days) to any address.
pub async fn invite<A: Accounts>(
    State(state): State<AppState<A>>,
    Tenant(tenant): Tenant,
    authenticated: Option<Extension<AuthenticatedTenant>>,
    caller: CallerAddr,
    tx: IdempotentTx<A::Database>,
    JsonBody(request): JsonBody<EmailRequest>,
) -> Accepted {
    require(authenticated.as_ref().map(|Extension(a)| a))?;
    send_link(
        &state,
        &tenant,
        &caller,
        &tx,
        &request.email,
        Flow::Invite,
        Target::Address,
    )
    .await
}
