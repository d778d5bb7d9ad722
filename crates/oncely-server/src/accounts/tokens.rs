//! Tokens: a link's record — written when its email is asked for, consumed when it is used,
//! read again before its email leaves ([`live_token`]).

use oncely::ServerSecret;
use oncely_outbox::Delivery;
use sqlx::{Encode, Executor, FromRow, IntoArguments, Type};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{AccountError, AccountSql, Accounts};
use crate::backend::Connection;
use crate::token::{Flow, Token};

/// A token to store (its hash only).
#[derive(Debug, Clone)]
pub struct NewToken<'a> {
    /// Random record id (the token is derived from it).
    pub id: Uuid,
    /// Owner tenant.
    pub tenant: &'a str,
    /// Owner user, if any. A token with neither user nor email is a decoy: never consumable.
    pub user_id: Option<Uuid>,
    /// The invited address (invites only).
    pub email: Option<&'a str>,
    /// `verification`, `password_reset`, `magic_link`, `invite`.
    pub flow: &'a str,
    /// SHA-256 of the token.
    pub hash: &'a [u8],
    /// End of validity.
    pub expires_at: OffsetDateTime,
    /// Verification tokens of a signup that chose a password: its Argon2id hash. It is set on
    /// the account only if the verifier re-enters the same password, so that whoever proves the
    /// address never adopts a password a stranger chose.
    pub password_hash: Option<&'a str>,
    /// Whether this token supersedes the user's live tokens of the same flow (not when its
    /// email will be suppressed: the user's current link must keep working). A signup's link
    /// that carries a password is never superseded (by a resend anyone can request): it lives
    /// until it expires or the address is verified.
    pub supersede: bool,
    /// Where the flow returns once the link is used.
    pub return_to: ReturnTo<'a>,
    /// The locale its email was asked in (a BCP 47 tag); `None`: the account's.
    pub locale: Option<&'a str>,
}

/// Where a link's flow returns once the link is used: a code is minted for a return URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnTo<'a> {
    /// Nowhere, no code is minted (an email change: the account is signed in already).
    Nowhere,
    /// This one of the tenant's return URLs (the request named it; checked before the
    /// transaction, so that a refused request writes nothing).
    Url(&'a str),
    /// The tenant's first return URL (none if it has none), read by the token's insert itself:
    /// a request that names none costs no read of its own.
    TenantsFirst,
}

/// A token that was consumed.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct ConsumedToken {
    /// The tenant the token was issued in (a link names its tenant through its token).
    pub tenant: String,
    /// The password hash a signup stored with its verification token, if any.
    pub password_hash: Option<String>,
    /// Its user, if it had one.
    pub user_id: Option<Uuid>,
    /// Its address (invites).
    pub email: Option<String>,
    /// The return URL chosen when the link was requested, if any: using the link mints a code.
    pub return_to: Option<String>,
    /// The locale its email was written in, if the request named one: using the link makes it
    /// the account's (the address owner read it).
    pub locale: Option<String>,
}

/// What the worker needs to send a token's email.
#[derive(Debug, Clone, FromRow)]
pub struct TokenForSend {
    /// The flow.
    pub flow: String,
    /// The tenant the token belongs to (an invitation's is the one to join).
    pub tenant: String,
    /// The account the token is for, if it has one (an invitation to a new address has none).
    pub user_id: Option<Uuid>,
    /// The recipient: the token's own address (the invited one, an email change's new one),
    /// else its user's; `None` for a decoy.
    pub recipient: Option<String>,
    /// Still usable (not consumed, not superseded, not expired).
    pub live: bool,
    /// SHA-256 of the token: tells which server secret (current or previous) derived it.
    #[sqlx(rename = "token_hash")]
    pub hash: Vec<u8>,
    /// The locale to write its email in: the link's, else its account's if the account is
    /// verified (`None`: English).
    pub locale: Option<String>,
}

/// The token of record `token_id` if its email is still to be sent, read now: the record, its
/// flow and the token derived again from the server secret that derived its stored hash (the
/// current one, or a previous one when the job was written before a rotation). The one check
/// of a link before it leaves: the email handler before it mails it, the `webhook` handler
/// before it delivers an `email.requested` event carrying it.
/// A decoy (no recipient) or a link used or superseded since is [`Delivery::Skipped`].
pub async fn live_token<A: Accounts>(
    accounts: &A,
    secret: &ServerSecret,
    token_id: Uuid,
) -> Result<(TokenForSend, Flow, Token), Delivery> {
    let record = match accounts.token_for_send(token_id).await {
        Ok(Some(record)) => record,
        Ok(None) => {
            return Err(Delivery::Permanent(
                "the token record no longer exists".into(),
            ));
        }
        Err(error) => {
            return Err(Delivery::Retry(format!(
                "reading the token record: {error:#}"
            )));
        }
    };
    if record.recipient.is_none() {
        return Err(Delivery::Skipped(
            "no account for this address: nothing to send".into(),
        ));
    }
    if !record.live {
        return Err(Delivery::Skipped(
            "the link was superseded or used before delivery: not sent".into(),
        ));
    }
    let Some(flow) = Flow::parse(&record.flow) else {
        return Err(Delivery::Permanent(format!(
            "unknown token flow {:?}",
            record.flow
        )));
    };
    let Some(token) = secret
        .all()
        .map(|secret| Token::derive(secret, flow, token_id))
        .find(|token| token.hash() == record.hash)
    else {
        return Err(Delivery::Permanent(
            "no configured server secret derives this link (rotated out of ONCELY_SECRET_PREVIOUS, or written by a process with another ONCELY_SECRET?): not sent"
                .into(),
        ));
    };
    Ok((record, flow, token))
}

/// Supersedes a user's live verification tokens once the address is proven.
pub(super) async fn supersede_verification<B>(
    conn: &mut Connection<B>,
    user_id: Uuid,
) -> Result<(), AccountError>
where
    B: AccountSql,
    for<'c> &'c mut Connection<B>: Executor<'c, Database = B::Database>,
    <B::Database as sqlx::Database>::Arguments: IntoArguments<B::Database>,
    for<'q> Uuid: Encode<'q, B::Database> + Type<B::Database>,
{
    sqlx::query(B::ACCOUNT_SQL.tokens.supersede_verification)
        .bind(user_id)
        .bind(B::at(None))
        .execute(conn)
        .await
        .map_err(AccountError::of)?;
    Ok(())
}

/// The statements of token records. One set per dialect (`postgres.rs`, `sqlite.rs`), in
/// [`Statements`](super::Statements).
#[derive(Debug, Clone, Copy)]
pub struct TokenStatements {
    /// Binds user_id, flow, supersede (bool), now. Supersedes the user's live tokens of the
    /// flow that carry no signup password, if `supersede`.
    pub supersede_flow: &'static str,
    /// Binds id, tenant, user_id, email, flow, token_hash, expires_at, now, password_hash,
    /// return_to, locale, tenants_first (bool: store the tenant's first return URL, read in the
    /// statement, instead of return_to).
    pub insert_token: &'static str,
    /// Where the dialect can in one statement: [`Self::supersede_flow`] then
    /// [`Self::insert_token`]; binds as `insert_token`, then supersede (bool). `None`: the two.
    pub supersede_and_insert_token: Option<&'static str>,
    /// Binds token_hash. Locks the account the token belongs to (if any) until the transaction
    /// ends, before the token is consumed.
    pub lock_token_account: &'static str,
    /// Binds token_hash, tenant (or NULL: any), flow, now. Consumes a live, owned token;
    /// returns `tenant`, `user_id`, `email`, `password_hash`, `return_to`, `locale`.
    pub consume_token: &'static str,
    /// Binds token_hash, tenant (or NULL: any), now. Counts an attempt at the signup password
    /// of a live verification token; returns `password_hash`, `password_attempts` (64-bit).
    pub signup_password_attempt: &'static str,
    /// Binds token_hash. Takes back one attempt at the token's signup password (never below 0).
    pub signup_password_unattempt: &'static str,
    /// Binds user_id, now. Supersedes the user's live verification tokens.
    pub supersede_verification: &'static str,
    /// Binds token_id, now. Returns `flow`, `tenant`, `user_id`, `token_hash`, `recipient` (the
    /// token's own address if it has one, else its user's), `locale` (the token's, else its
    /// user's if the user is verified), `live`.
    pub token_for_send: &'static str,
    /// Binds user_id, now, invites (bool). Supersedes every live token of the user — its
    /// invitations only if `invites`.
    pub supersede_user_tokens: &'static str,
    /// Binds now, expired_for (seconds, a float), limit. Deletes up to `limit` tokens that
    /// expired more than `expired_for` before `now`.
    pub prune_tokens: &'static str,
}
