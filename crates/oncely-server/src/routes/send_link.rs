//! Emailing a link — what every flow that sends one shares (signup, resend, password reset,
//! magic link, invite): the same 202 whatever the address ([`accepted`]), issuing a token — or a
//! never-usable decoy when there is no account — and its email job ([`Link::issue`]), and the
//! request for a link by address ([`LinkRequest::send_link`]). The same statements run
//! whether or not the address has an account and whether or not the email is suppressed
//! ([`super::mail_caps`]): responses and their timing cannot tell those cases apart.

use axum::Json;
use axum::http::StatusCode;
use oncely::TenantId;
use oncely_outbox::{JobStore, NewJob};
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use super::mail_caps::suppression;
use super::post::IdempotentPost;
use super::tenants::Tenant;
use crate::accounts::{Accounts, NewToken, ReturnTo};
use crate::email::EmailAddress;
use crate::templates::Locale;
use crate::token::{Flow, Token};

/// The answer of every route that emails a link.
pub type Accepted = (StatusCode, Json<Value>);

/// The same answer whether or not the address has an account.
pub fn accepted() -> Accepted {
    (
        StatusCode::ACCEPTED,
        Json(json!({
            "status": "accepted",
            "detail": "If this address can be used, an email with the next step is on its way to it."
        })),
    )
}

/// `{ "email": … }`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmailRequest {
    /// The address the link is for.
    #[schema(example = "ada@example.com")]
    email: String,
    /// Optional: where the link returns once used, exactly one of the tenant's return URLs
    /// (default: its first; none configured: nowhere).
    #[schema(example = "https://app.example.com/auth/callback")]
    return_to: Option<String>,
    /// Optional: the language of the email, a BCP 47 tag (default: the request's
    /// `Accept-Language`, else the account's). A locale without templates falls back to its
    /// language, then English; never an error.
    #[schema(example = "de-AT")]
    locale: Option<String>,
}

/// Which account a link goes to, for a flow.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// Only an account whose address is not verified yet (resend verification).
    Pending,
    /// Any account (reset, magic link).
    Account,
    /// The address itself, with its account if it has one (invites).
    Address,
}

/// A request for a link by address.
pub type LinkRequest<A> = IdempotentPost<A, EmailRequest>;

impl<A: Accounts> LinkRequest<A> {
    /// Emails a link of `flow` to the address if it has the `target` account (else a decoy
    /// that sends nothing), within the email caps, and answers 202 either way.
    pub async fn send_link(self, flow: Flow, target: Target) -> Result<Accepted, ApiError> {
        let email = EmailAddress::parse(&self.body.email)
            .map_err(|_| ApiError::invalid_request("email is not a valid address"))?;
        let locale = self.locale(self.body.locale.as_deref())?;
        let Self {
            state,
            tenant: Tenant { id: tenant, .. },
            caller,
            tx,
            body,
            ..
        } = self;
        let return_to = return_url(&state, &tenant, body.return_to.as_deref()).await?;
        let mut conn = tx.lock().await?;
        let user = A::find_user(&mut conn, tenant.as_str(), &email).await?;
        let (suppressed, charge) =
            suppression(&mut *conn, &state, &tenant, &email, &caller).await?;
        let owner = match (user, target) {
            (user, Target::Address) => Owner {
                user: user.map(|u| u.id),
                email: Some(email.as_str()),
            },
            (Some(user), Target::Account) => Owner::account(user.id),
            (Some(user), Target::Pending) if !user.verified => Owner::account(user.id),
            _ => Owner::NOBODY,
        };
        let link = Link {
            flow,
            owner,
            to: &email,
            return_to,
            locale: locale.as_ref(),
        };
        link.issue(&mut *conn, &state, &tenant, suppressed, None)
            .await?;
        tracing::info!(email = %email.masked(), tenant = %tenant, flow = flow.as_str(), "link requested");
        charge.keep();
        Ok(accepted())
    }
}

/// Where a link `tenant`'s request returns: `requested` if it is, byte for byte, one of the
/// tenant's return URLs (exact match, as OAuth 2.1 asks: no prefix, no normalization), else
/// 400 `return-url-not-allowed`. Read on the pool before the transaction opens: a refused
/// request writes nothing. A request that names none reads nothing here: its token's insert
/// stores the tenant's first ([`ReturnTo::TenantsFirst`]).
pub async fn return_url<'r, A: Accounts>(
    state: &AppState<A>,
    tenant: &TenantId,
    requested: Option<&'r str>,
) -> Result<ReturnTo<'r>, ApiError> {
    let Some(requested) = requested else {
        return Ok(ReturnTo::TenantsFirst);
    };
    let allowed = state.accounts.return_urls(tenant.as_str()).await?;
    if allowed
        .iter()
        .any(|url| url.as_bytes() == requested.as_bytes())
    {
        Ok(ReturnTo::Url(requested))
    } else {
        Err(ApiError::ReturnUrlNotAllowed)
    }
}

/// Who a token is for.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    /// The account, if there is one.
    pub user: Option<Uuid>,
    /// The invited address (invites only).
    pub email: Option<&'a str>,
}

impl Owner<'_> {
    /// Nobody: the decoy written for an address without an account.
    pub const NOBODY: Self = Self {
        user: None,
        email: None,
    };

    /// The account `user`.
    pub fn account(user: Uuid) -> Self {
        Self {
            user: Some(user),
            email: None,
        }
    }
}

/// A verification token issued by a signup. It supersedes no other token — each signup's link
/// stays its own, so a stranger's signup cannot kill the owner's link — and the password it
/// carries takes effect only if whoever verifies re-enters it.
#[derive(Debug, Clone, Copy, Default)]
pub struct FromSignup<'a> {
    /// The Argon2id hash of the password the signup chose, if any.
    pub password_hash: Option<&'a str>,
}

/// A link to issue: its flow, who its token is for, and the address it is asked for.
#[derive(Debug, Clone, Copy)]
pub struct Link<'a> {
    /// The flow.
    pub flow: Flow,
    /// Who the token is for (nobody: a decoy).
    pub owner: Owner<'a>,
    /// The address the request named (the recipient, if the email is sent).
    pub to: &'a EmailAddress,
    /// Where the flow returns once the link is used (stored on decoys too: the same work).
    pub return_to: ReturnTo<'a>,
    /// The language of its email (stored on decoys too); `None`: the account's.
    pub locale: Option<&'a Locale>,
}

impl Link<'_> {
    /// Issues a link: stores a token of the link's flow for its owner (a decoy if nobody) and
    /// enqueues its email job, in the request's transaction. A token that is not from a signup
    /// supersedes the owner's live tokens of the flow (unless its email is suppressed: then the
    /// current link must keep working).
    pub async fn issue<A: Accounts>(
        self,
        conn: &mut <A::Database as sqlx::Database>::Connection,
        state: &AppState<A>,
        tenant: &TenantId,
        suppressed: Option<String>,
        signup: Option<FromSignup<'_>>,
    ) -> anyhow::Result<()> {
        let Link {
            flow,
            owner,
            to,
            return_to,
            locale,
        } = self;
        let token_id = Uuid::new_v4();
        let expires_at = OffsetDateTime::now_utc() + flow.lifetime();
        let hash = Token::derive(&state.secret, flow, token_id).hash();
        let token = NewToken {
            id: token_id,
            tenant: tenant.as_str(),
            user_id: owner.user,
            email: owner.email,
            flow: flow.as_str(),
            hash: &hash,
            expires_at,
            password_hash: signup.and_then(|s| s.password_hash),
            supersede: suppressed.is_none() && signup.is_none(),
            return_to,
            locale: locale.map(Locale::as_str),
        };
        A::insert_token(conn, &token).await?;
        let user = owner
            .user
            .map_or_else(|| "no-account".to_owned(), |u| u.to_string());
        let job = NewJob::new(
            format!("{}:{tenant}:{user}:{token_id}", flow.as_str()),
            flow.job_kind(),
            state.email_payload(
                json!({ "token_id": token_id, "suppressed": suppressed }),
                to.as_str(),
            ),
        )
        .not_after(expires_at);
        state.jobs.enqueue(conn, &job).await?;
        Ok(())
    }
}
