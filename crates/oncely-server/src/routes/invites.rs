//! Invitations. `POST /v1/invites` (tenant API key required) emails an invitation (7 days) to
//! any address. The link opens `GET /v1/invites/accept` (the page `invites.html`), whose button
//! `POST /v1/invites/accept`s: that creates the account (verified) or joins the existing one,
//! once, in the invite's own tenant.

use serde_json::json;

use super::account_events::account_event;
use super::error::ApiError;
use super::new_password::hash_new_password;
use super::send_link::{Accepted, LinkRequest, Target};
use super::use_link::{LinkUse, LinkUsed};
use crate::accounts::Accounts;
use crate::token::Flow;
use crate::webhooks::EventType;

/// `POST /v1/invites` (tenant API key required): an invitation (7 days) to any address.
pub async fn invite<A: Accounts>(post: LinkRequest<A>) -> Result<Accepted, ApiError> {
    post.tenant.require_proven()?;
    post.send_link(Flow::Invite, Target::Address).await
}

/// `POST /v1/invites/accept`: creates the account (verified) or joins the existing one; one
/// membership per (tenant, user). The tenant is the invite's own. Writes `invite.accepted`,
/// after `user.created` for a new account or `user.verified` for a pending one.
pub async fn accept<A: Accounts>(mut post: LinkUse<A>) -> LinkUsed {
    let password_hash = hash_new_password(post.body.password.take(), &post.caller).await?;
    let (mut conn, token) = post.use_token(Flow::Invite).await?;
    let email = token.email.as_deref().ok_or(ApiError::InvalidToken)?;
    let (password_hash, locale) = (password_hash.as_deref(), token.locale.as_deref());
    let accepted = A::accept_invite(&mut conn, &token.tenant, email, password_hash, locale).await?;
    let (state, tenant, user) = (&post.state, token.tenant.as_str(), accepted.user_id);
    if accepted.created {
        let (kind, data) = (EventType::UserCreated, json!({ "email_verified": true }));
        account_event(&mut *conn, state, tenant, kind, user, email, data).await?;
    } else if accepted.verified {
        let kind = EventType::UserVerified;
        account_event(&mut *conn, state, tenant, kind, user, email, json!({})).await?;
    }
    let (kind, data) = (
        EventType::InviteAccepted,
        json!({ "created": accepted.created }),
    );
    account_event(&mut *conn, state, tenant, kind, user, email, data).await?;
    let body = json!({ "status": "joined" });
    post.answer(&mut conn, &token, user, body).await
}
