//! Invitations. `POST /v1/invites` (tenant API key required) emails an invitation (7 days) to
//! any address. The link opens `GET /v1/invites/accept` (the page `invites.html`), whose button
//! `POST /v1/invites/accept`s: that creates the account (verified) or joins the existing one,
//! once, in the invite's own tenant.

use serde_json::json;

use super::error::ApiError;
use super::new_password::hash_new_password;
use super::send_link::{Accepted, LinkRequest, Target};
use super::use_link::{LinkUse, LinkUsed};
use crate::accounts::Accounts;
use crate::token::Flow;

/// `POST /v1/invites` (tenant API key required): an invitation (7 days) to any address.
pub async fn invite<A: Accounts>(post: LinkRequest<A>) -> Result<Accepted, ApiError> {
    post.tenant.require_proven()?;
    post.send_link(Flow::Invite, Target::Address).await
}

/// `POST /v1/invites/accept`: creates the account (verified) or joins the existing one; one
/// membership per (tenant, user). The tenant is the invite's own.
pub async fn accept<A: Accounts>(mut post: LinkUse<A>) -> LinkUsed {
    let password_hash = hash_new_password(post.body.password.take(), &post.caller).await?;
    let (mut conn, token) = post.use_token(Flow::Invite).await?;
    let email = token.email.as_deref().ok_or(ApiError::InvalidToken)?;
    let user = A::accept_invite(&mut conn, &token.tenant, email, password_hash.as_deref()).await?;
    let body = json!({ "status": "joined" });
    post.answer(&mut conn, &token, user, body).await
}
