//! Changing an account's address. `POST /v1/users/{id}/email-change` (tenant API key
//! required) emails a confirmation link (1 h) to the new address and a notice to the current
//! one; if another account of the tenant has the new address, no link is sent (a decoy token
//! keeps the work the same) and that account gets a notice instead — the caller gets the same
//! 202 either way. The link opens `GET /v1/email-change/confirm` (the page
//! `email_change.html`), whose button `POST /v1/email-change/confirm`s: that swaps the address
//! once, marks it verified (the link proved the mailbox) and ends every live link of the
//! account.

use axum::Json;
use axum::extract::Path;
use oncely_outbox::{JobStore, NewJob};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use super::account_events::{account_event, address_of};
use super::error::ApiError;
use super::mail_caps::suppression;
use super::post::IdempotentPost;
use super::send_link::{Accepted, Link, Owner, accepted};
use super::use_link::{LinkUse, LinkUsed};
use crate::accounts::{Accounts, ReturnTo};
use crate::email::EmailAddress;
use crate::mail::{EMAIL_CHANGE_NOTICE, EMAIL_TAKEN_NOTICE};
use crate::token::Flow;
use crate::webhooks::EventType;

/// `{ "new_email": … }`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmailChangeRequest {
    /// The address the account is to have; normalized (trimmed, IDNA, lower case) and strictly
    /// validated.
    #[schema(example = "ada@new.example.com")]
    new_email: String,
    /// Optional: the language of the link's email, a BCP 47 tag (default: the request's
    /// `Accept-Language`, else the account's). The notices are in the account's.
    #[schema(example = "de-AT")]
    locale: Option<String>,
}

/// `POST /v1/users/{id}/email-change` (tenant API key required): a confirmation link (1 h;
/// the user's earlier change links stop working) to the new address and a notice to the
/// current one — or, if the new address is another account's, a notice to that account only.
/// 404 `user-not-found` unless the user is the key's tenant's.
pub async fn request<A: Accounts>(
    Path(id): Path<String>,
    post: IdempotentPost<A, EmailChangeRequest>,
) -> Result<Accepted, ApiError> {
    post.tenant.require_proven()?;
    let locale = post.locale(post.body.locale.as_deref())?;
    let IdempotentPost {
        state,
        tenant,
        caller,
        tx,
        body,
        ..
    } = post;
    let tenant = tenant.id;
    let new = EmailAddress::parse(&body.new_email)
        .map_err(|_| ApiError::invalid_request("new_email is not a valid address"))?;
    let mut conn = tx.lock().await?;
    // A malformed id, an unknown one and another tenant's user: one answer.
    let user = id.parse::<Uuid>().ok();
    let old = match user {
        Some(user) => A::user_in_tenant(&mut conn, tenant.as_str(), user).await?,
        None => None,
    };
    let (Some(user), Some(old)) = (user, old) else {
        return Err(ApiError::UserNotFound);
    };
    if old == new.as_str() {
        return Err(ApiError::invalid_request(
            "new_email is the account's address already",
        ));
    }
    // The same statements whether or not the new address is taken: the caller learns nothing.
    let taken_by = A::find_user(&mut conn, tenant.as_str(), &new).await?;
    let (suppressed_new, charge_new) =
        suppression(&mut *conn, &state, &tenant, &new, &caller).await?;
    let old_address = EmailAddress::parse(&old).map_err(|_| {
        anyhow::anyhow!("the stored address of a user does not parse as an address")
    })?;
    let (suppressed_old, charge_old) =
        suppression(&mut *conn, &state, &tenant, &old_address, &caller).await?;
    let owner = match taken_by {
        None => Owner {
            user: Some(user),
            email: Some(new.as_str()),
        },
        Some(_) => Owner::NOBODY,
    };
    let link = Link {
        flow: Flow::EmailChange,
        owner,
        to: &new,
        // The account is signed in to the application already: no code, no return URL.
        return_to: ReturnTo::Nowhere,
        locale: locale.as_ref(),
    };
    link.issue(&mut *conn, &state, &tenant, suppressed_new.clone(), None)
        .await?;
    // The notice names the current address itself: by the time it is sent the account may
    // have the new one.
    let requested = NewJob::new(
        format!("email-change-notice:{tenant}:{user}:{}", tx.derived_key()),
        EMAIL_CHANGE_NOTICE,
        state.email_payload(
            json!({
                "to": old,
                "new_email": new.masked(),
                "user_id": user,
                "tenant": tenant.as_str(),
                "suppressed": suppressed_old,
            }),
            &old,
        ),
    );
    state.jobs.enqueue(&mut conn, &requested).await?;
    if let Some(owner) = taken_by {
        let taken = NewJob::new(
            format!(
                "email-taken-notice:{tenant}:{}:{}",
                owner.id,
                tx.derived_key()
            ),
            EMAIL_TAKEN_NOTICE,
            state.email_payload(
                json!({ "user_id": owner.id, "tenant": tenant.as_str(), "suppressed": suppressed_new }),
                new.as_str(),
            ),
        );
        state.jobs.enqueue(&mut conn, &taken).await?;
    }
    tracing::info!(email = %new.masked(), tenant = %tenant, user = %user, "email change requested");
    charge_new.keep();
    charge_old.keep();
    Ok(accepted())
}

/// `POST /v1/email-change/confirm`: gives the account the new address, verified, and ends
/// every live link of the account (the old address's reset and sign-in links among them).
/// If another account has the address by now, `token-invalid` and nothing changes. Writes
/// `user.email_changed`, then `user.verified` if the account was pending.
pub async fn confirm<A: Accounts>(post: LinkUse<A>) -> LinkUsed {
    if post.body.password.is_some() {
        return Err(ApiError::invalid_request("this link takes no password"));
    }
    let (mut conn, user, token) = post.use_account_token(Flow::EmailChange).await?;
    let email = token.email.ok_or(ApiError::InvalidToken)?;
    let tenant = token.tenant.as_str();
    // The account is locked (its link was used): what it is now is what the change replaces.
    let previous = address_of::<A>(&mut *conn, tenant, user).await?;
    let was_pending = A::lock_user(&mut conn, tenant, &previous)
        .await?
        .is_some_and(|account| !account.verified);
    // Taken meanwhile: the 400 rolls the transaction back, the token unused.
    if !A::change_email(&mut conn, user, &email).await? {
        return Err(ApiError::InvalidToken);
    }
    let state = &post.state;
    let data = json!({ "previous_email": crate::email::masked(&previous) });
    let kind = EventType::UserEmailChanged;
    account_event(&mut *conn, state, tenant, kind, user, &email, data).await?;
    if was_pending {
        let kind = EventType::UserVerified;
        account_event(&mut *conn, state, tenant, kind, user, &email, json!({})).await?;
    }
    tracing::info!(tenant = %token.tenant, user = %user, "email changed");
    Ok(Json(json!({ "status": "email_changed" })))
}
