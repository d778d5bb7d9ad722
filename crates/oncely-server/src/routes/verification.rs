//! Verification of an address. `POST /v1/signup` sends the first link ([`super::signup`]);
//! `POST /v1/verification/resend` a new one to an account not verified yet. The link opens
//! `GET /v1/verify` (the page `verification.html`), whose button `POST /v1/verify`s: that
//! verifies the address once, adopting the signup's password only if it is re-entered.

use secrecy::SecretString;
use serde_json::json;

use super::account_events::{account_event, address_of};
use super::error::ApiError;
use super::send_link::{Accepted, LinkRequest, Target};
use super::use_link::{LinkUse, LinkUsed};
use crate::accounts::Accounts;
use crate::password;
use crate::token::{self, Flow};
use crate::webhooks::EventType;

/// How often a verification link's signup password may be re-entered.
pub const PASSWORD_ATTEMPTS: i64 = 5;

/// `POST /v1/verification/resend`: a new verification link (superseding the last resent one)
/// if the address has an unverified account.
pub async fn resend<A: Accounts>(post: LinkRequest<A>) -> Result<Accepted, ApiError> {
    post.send_link(Flow::Verification, Target::Pending).await
}

/// `POST /v1/verify`: marks the address verified. A signup that chose a password stored its
/// hash with this link's token; the account gets that password only if the request re-enters
/// it — whoever proves the address never adopts a password someone else chose (an attacker who
/// pre-registered the address). A pending account that verifies writes `user.verified`. Without a password the address is verified and the account
/// keeps no password (set one with a password reset).
pub async fn verify<A: Accounts>(mut post: LinkUse<A>) -> LinkUsed {
    // A re-entered password is checked before the transaction opens: Argon2 takes tens of
    // milliseconds, and the key's transaction (on SQLite the write lock) is not held meanwhile.
    let adopted = match post.body.password.take() {
        None => None,
        Some(presented) => Some(signup_password(&post, presented).await?),
    };
    let (mut conn, user, token) = post.use_account_token(Flow::Verification).await?;
    if adopted.is_some() && token.password_hash != adopted {
        return Err(ApiError::InvalidToken);
    }
    if A::mark_verified(&mut conn, user, adopted.as_deref(), token.locale.as_deref()).await? {
        let email = address_of::<A>(&mut *conn, &token.tenant, user).await?;
        let (state, kind) = (&post.state, EventType::UserVerified);
        account_event(
            &mut *conn,
            state,
            &token.tenant,
            kind,
            user,
            &email,
            json!({}),
        )
        .await?;
    }
    let body = json!({ "status": "verified", "password_set": adopted.is_some() });
    post.answer(&mut conn, &token, user, body).await
}

/// The hash of the password the link's signup chose, if `presented` is that password. A wrong
/// one is one more attempt, counted on the pool: the count survives the request's rollback.
async fn signup_password<A: Accounts>(
    post: &LinkUse<A>,
    presented: String,
) -> Result<String, ApiError> {
    let tenant = post.tenant.proven().map(|t| t.as_str());
    let hash = token::hash(&post.body.token);
    let (stored, attempts) = post
        .state
        .accounts
        .signup_password_attempt(tenant, &hash)
        .await?
        .ok_or(ApiError::InvalidToken)?;
    let stored = stored.ok_or_else(|| {
        ApiError::invalid_request("this signup chose no password; confirm without one")
    })?;
    // Whoever sees the link (a mail scanner, a log) must not guess the password online.
    if attempts > PASSWORD_ATTEMPTS {
        return Err(ApiError::invalid_request(
            "too many wrong passwords for this link; confirm without a password, then set one with a password reset",
        ));
    }
    let share = post.caller.bucket();
    let presented = SecretString::from(presented);
    // Only a wrong password stays counted. The right one is uncounted at once: the request may
    // still fail after it (a lock wait past the timeout, the database gone: 503, retry later),
    // and the owner retrying through a busy moment must not use up the link's attempts. A check
    // that did not run (every hasher busy: 503) is no attempt either.
    match password::verify(share.as_deref(), &stored, presented).await {
        Ok(false) => Err(ApiError::PasswordMismatch),
        Ok(true) => {
            post.state.accounts.signup_password_unattempt(&hash).await?;
            Ok(stored)
        }
        Err(error) => {
            post.state.accounts.signup_password_unattempt(&hash).await?;
            Err(error.into())
        }
    }
}
