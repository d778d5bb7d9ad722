//! Password reset. `POST /v1/password-reset` emails a reset link (1 h) if the address has an
//! account. The link opens `GET /v1/password-reset/confirm` (the page `password_reset.html`),
//! whose button `POST /v1/password-reset/confirm`s: that sets the new password once.

use serde_json::json;

use super::account_events::{account_event, address_of};
use super::error::ApiError;
use super::new_password::hash_new_password;
use super::send_link::{Accepted, LinkRequest, Target};
use super::use_link::{LinkUse, LinkUsed};
use crate::accounts::Accounts;
use crate::token::Flow;
use crate::webhooks::EventType;

/// `POST /v1/password-reset`: a reset link (1 h; earlier ones stop working) if the address has
/// an account.
pub async fn request<A: Accounts>(post: LinkRequest<A>) -> Result<Accepted, ApiError> {
    post.send_link(Flow::PasswordReset, Target::Account).await
}

/// `POST /v1/password-reset/confirm`: sets the new password (and, since the link proved the
/// address, marks it verified); every other live link of the account but its invitations stops
/// working. Writes `password.changed`, after `user.verified` if the account was pending.
pub async fn confirm<A: Accounts>(mut post: LinkUse<A>) -> LinkUsed {
    let password = post.body.password.take();
    let Some(password_hash) = hash_new_password(password, &post.caller).await? else {
        return Err(ApiError::invalid_request("password is required"));
    };
    let (mut conn, user, token) = post.use_account_token(Flow::PasswordReset).await?;
    let verified = A::mark_verified(&mut conn, user, None, token.locale.as_deref()).await?;
    A::set_password(&mut conn, user, &password_hash).await?;
    let (state, tenant) = (&post.state, token.tenant.as_str());
    let email = address_of::<A>(&mut *conn, tenant, user).await?;
    if verified {
        let kind = EventType::UserVerified;
        account_event(&mut *conn, state, tenant, kind, user, &email, json!({})).await?;
    }
    let kind = EventType::PasswordChanged;
    account_event(&mut *conn, state, tenant, kind, user, &email, json!({})).await?;
    // Whoever else holds a link of the account — an email change an intruder asked for, a
    // magic link, another reset link — loses it with the old password.
    A::end_links(&mut conn, user, false).await?;
    let body = json!({ "status": "password_changed" });
    post.answer(&mut conn, &token, user, body).await
}
