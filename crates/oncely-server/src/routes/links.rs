//! The routes that email a link: resend verification, password reset, magic link, invite.
//! Each answers the same 202 whether or not the address has an account (and does the same
//! database work: see [`super::issue`]).

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use oncely::{IdempotentTx, Problem, TenantId};
use serde::Deserialize;
use serde_json::Value;

use super::issue::{Client, Owner, suppression, token_email};
use super::tenant::{AuthenticatedTenant, require};
use super::{AppState, Body, accepted, invalid_request, unexpected};
use crate::accounts::Accounts;
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

type Accepted = Result<(StatusCode, Json<Value>), Problem>;

/// Which account a link goes to, for a flow.
#[derive(Clone, Copy)]
enum Target {
    /// Only an account whose address is not verified yet (resend verification).
    Pending,
    /// Any account (reset, magic link).
    Account,
}

async fn send_link<A: Accounts>(
    state: &AppState<A>,
    tenant: &TenantId,
    client: &Client,
    tx: &IdempotentTx<A::Database>,
    email: &str,
    flow: Flow,
    target: Target,
) -> Accepted {
    let email =
        EmailAddress::parse(email).map_err(|_| invalid_request("email is not a valid address"))?;
    let mut conn = tx.lock().await;
    let user = A::find_user(&mut conn, tenant.as_str(), &email)
        .await
        .map_err(unexpected)?;
    let suppressed = suppression(&mut *conn, state, tenant, &email, client)
        .await
        .map_err(unexpected)?;
    let owner = match (user, target) {
        (Some(user), Target::Account) => Some(user.id),
        (Some(user), Target::Pending) if !user.verified => Some(user.id),
        _ => None,
    };
    let owner = Owner {
        user: owner,
        email: None,
    };
    token_email(&mut *conn, state, tenant, flow, owner, suppressed)
        .await
        .map_err(unexpected)?;
    tracing::info!(email = %email.masked(), tenant = %tenant, flow = flow.as_str(), "link requested");
    Ok(accepted())
}

fn tenant_of(tenant: Option<Extension<TenantId>>) -> TenantId {
    tenant.map(|Extension(t)| t).unwrap_or_default()
}

/// `POST /v1/verification/resend`: a new verification link (superseding the old one) if the
/// address has an unverified account.
pub async fn resend<A: Accounts>(
    State(state): State<AppState<A>>,
    tenant: Option<Extension<TenantId>>,
    client: Client,
    tx: IdempotentTx<A::Database>,
    Body(request): Body<EmailRequest>,
) -> Accepted {
    send_link(
        &state,
        &tenant_of(tenant),
        &client,
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
    tenant: Option<Extension<TenantId>>,
    client: Client,
    tx: IdempotentTx<A::Database>,
    Body(request): Body<EmailRequest>,
) -> Accepted {
    send_link(
        &state,
        &tenant_of(tenant),
        &client,
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
    tenant: Option<Extension<TenantId>>,
    client: Client,
    tx: IdempotentTx<A::Database>,
    Body(request): Body<EmailRequest>,
) -> Accepted {
    send_link(
        &state,
        &tenant_of(tenant),
        &client,
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
    tenant: Option<Extension<TenantId>>,
    authenticated: Option<Extension<AuthenticatedTenant>>,
    client: Client,
    tx: IdempotentTx<A::Database>,
    Body(request): Body<EmailRequest>,
) -> Accepted {
    require(authenticated.as_ref().map(|Extension(a)| a))?;
    let tenant = tenant_of(tenant);
    let email = EmailAddress::parse(&request.email)
        .map_err(|_| invalid_request("email is not a valid address"))?;
    let mut conn = tx.lock().await;
    let user = A::find_user(&mut conn, tenant.as_str(), &email)
        .await
        .map_err(unexpected)?;
    let suppressed = suppression(&mut *conn, &state, &tenant, &email, &client)
        .await
        .map_err(unexpected)?;
    let owner = Owner {
        user: user.map(|u| u.id),
        email: Some(email.as_str()),
    };
    token_email(&mut *conn, &state, &tenant, Flow::Invite, owner, suppressed)
        .await
        .map_err(unexpected)?;
    tracing::info!(email = %email.masked(), tenant = %tenant, "invite sent");
    Ok(accepted())
}
