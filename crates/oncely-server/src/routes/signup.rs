//! `POST /v1/signup`: one account per (tenant, address), one email per request — a
//! verification link ([`super::verification`] uses it), or a notice to an address that is
//! already verified.

use oncely_outbox::{JobStore, NewJob};
use serde::Deserialize;
use serde_json::json;

use super::account_events::account_event_to;
use super::error::ApiError;
use super::mail_caps::email_count;
use super::new_password::hash_new_password;
use super::post::{IdempotentPost, request_locale};
use super::send_link::{Accepted, FromSignup, Link, Owner, accepted, return_url};
use crate::accounts::{Accounts, SignupCounted, SignupOutcome};
use crate::email::EmailAddress;
use crate::mail::SIGNUP_NOTICE;
use crate::token::Flow;
use crate::webhooks::EventType;

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
    /// Optional: where the verification link returns once used, exactly one of the tenant's
    /// return URLs (default: its first; none configured: nowhere).
    #[schema(example = "https://app.example.com/auth/callback")]
    return_to: Option<String>,
    /// Optional: the language of the account's emails, a BCP 47 tag (default: the request's
    /// `Accept-Language`). A locale without templates falls back to its language, then
    /// English; never an error.
    #[schema(example = "de-AT")]
    locale: Option<String>,
}

/// Creates the account (or finds it), and the email for it — a verification link, or a notice
/// to an account that exists — in the idempotency layer's transaction: they commit with the
/// stored response, once — and, for a new account, its `user.created` event.
pub async fn signup<A: Accounts>(
    post: IdempotentPost<A, SignupRequest>,
) -> Result<Accepted, ApiError> {
    let IdempotentPost {
        state,
        tenant,
        caller,
        tx,
        body: request,
        accepted_languages,
    } = post;
    let tenant = tenant.id;
    let locale = request_locale(
        &state,
        &tenant,
        request.locale.as_deref(),
        accepted_languages,
    )?;
    let email = EmailAddress::parse(&request.email)
        .map_err(|_| ApiError::invalid_request("email is not a valid address"))?;
    if let Some(source) = &request.source
        && (source.len() > 64 || source.chars().any(char::is_control))
    {
        return Err(ApiError::invalid_request(
            "source is at most 64 printable characters",
        ));
    }
    let return_to = return_url(&state, &tenant, request.return_to.as_deref()).await?;
    let password_hash = hash_new_password(request.password, &caller).await?;

    let mut conn = tx.lock().await?;
    // After the claim: a copy of this request that loses it (a replay, a 409, a 422) must not
    // spend the client's email allowance.
    let count = email_count(&state, &tenant, &email, &caller);
    let SignupCounted {
        outcome: row,
        counts,
        targets,
    } = A::signup_user_counted(
        &mut conn,
        tenant.as_str(),
        &email,
        request.source.as_deref(),
        &count,
    )
    .await?;
    if let SignupOutcome::Created(user) = row {
        let verified = json!({ "email_verified": false });
        let (kind, tenant) = (EventType::UserCreated, tenant.as_str());
        account_event_to(
            &mut *conn,
            &state,
            tenant,
            &targets,
            kind,
            user,
            email.as_str(),
            verified,
        )
        .await?;
    }
    let suppressed = count.verdict(&state.limits, counts)?;
    // A pending account's password waits on this signup's own token: the account gets it only
    // when the address owner verifies with this link and re-enters it. For a verified account a
    // decoy token keeps the work the same as for a new address; its email is a notice.
    let (owner, link_suppressed, password_hash, notice) = match row {
        SignupOutcome::Created(user) | SignupOutcome::Pending(user) => (
            Owner::account(user),
            suppressed.clone(),
            password_hash.as_deref(),
            None,
        ),
        SignupOutcome::Verified(user) => (Owner::NOBODY, Some("decoy".into()), None, Some(user)),
    };
    let signup = FromSignup { password_hash };
    let link = Link {
        flow: Flow::Verification,
        owner,
        to: &email,
        return_to,
        locale: locale.as_ref(),
    };
    link.issue(&mut *conn, &state, &tenant, link_suppressed, Some(signup))
        .await?;
    if let Some(user) = notice {
        let job = NewJob::new(
            format!("signup-notice:{tenant}:{user}:{}", tx.derived_key()),
            SIGNUP_NOTICE,
            state.email_payload(
                json!({ "user_id": user, "tenant": tenant.as_str(), "suppressed": suppressed }),
                email.as_str(),
            ),
        );
        state.jobs.enqueue(&mut conn, &job).await?;
    }
    tracing::info!(email = %email.masked(), tenant = %tenant, "signup accepted");
    count.charge.keep();
    Ok(accepted())
}
