//! Magic links. `POST /v1/magic-link` emails a sign-in link (15 min) if the address has an
//! account. The link opens `GET /v1/magic-link/consume` (the page `magic_link.html`), whose
//! button `POST /v1/magic-link/consume`s: that signs in once. oncely issues no session: the
//! calling application does that on the 200.

use serde_json::json;

use super::account_events::{SignInMethod, account_event, address_of};
use super::error::ApiError;
use super::send_link::{Accepted, LinkRequest, Target};
use super::use_link::{LinkUse, LinkUsed};
use crate::accounts::Accounts;
use crate::token::Flow;
use crate::webhooks::EventType;

/// `POST /v1/magic-link`: a sign-in link (15 min) if the address has an account.
pub async fn request<A: Accounts>(post: LinkRequest<A>) -> Result<Accepted, ApiError> {
    post.send_link(Flow::MagicLink, Target::Account).await
}

/// `POST /v1/magic-link/consume`: signs in (and marks the address verified; a password a signup
/// left on a verification link is not adopted, and that link stops working). Writes
/// `user.signed_in` (`method: magic_link`), after `user.verified` if the account was pending.
pub async fn sign_in<A: Accounts>(post: LinkUse<A>) -> LinkUsed {
    if post.body.password.is_some() {
        return Err(ApiError::invalid_request("this link takes no password"));
    }
    let (mut conn, user, token) = post.use_account_token(Flow::MagicLink).await?;
    let verified = A::mark_verified(&mut conn, user, None, token.locale.as_deref()).await?;
    let (state, tenant) = (&post.state, token.tenant.as_str());
    let email = address_of::<A>(&mut *conn, tenant, user).await?;
    if verified {
        let kind = EventType::UserVerified;
        account_event(&mut *conn, state, tenant, kind, user, &email, json!({})).await?;
    }
    let method = json!({ "method": SignInMethod::MagicLink.as_str() });
    let kind = EventType::UserSignedIn;
    account_event(&mut *conn, state, tenant, kind, user, &email, method).await?;
    let body = json!({ "status": "signed_in" });
    post.answer(&mut conn, &token, user, body).await
}
