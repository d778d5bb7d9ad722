//! Account storage: the SQL of the account flows, its statements once per dialect
//! ([`postgres`], [`sqlite`], under the names of [`Statements`]) and its Rust once ([`Accounts`],
//! for every [`Backend`]). Handlers run it inside the idempotency layer's transaction.
//!
//! What each aggregate's rows are, and the Rust around them, is in a file of its own: `users`,
//! `tokens` (with a link's live check, [`live_token`]), `codes`, `tenants`, `endpoints`
//! (webhooks), `limits` (the email caps' counters); the one [`Accounts`] trait
//! and its one implementation are here.

use std::future::Future;

use sqlx::{AssertSqlSafe, Encode, Executor, FromRow, IntoArguments, Type};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::backend::{Backend, Connection, MIGRATION_TABLES};
use crate::email::EmailAddress;
use crate::limits::mail::MailCount;
use oncely_sql::Db;

mod codes;
mod endpoints;
mod limits;
pub mod postgres;
pub mod sqlite;
mod statements;
mod tenants;
mod tokens;
mod users;

pub use codes::{CodeStatements, ExchangedCode, NewCode};
pub use endpoints::{EndpointRecord, EndpointStatements, NewEndpoint};
pub use limits::{LimitStatements, count_in};
use statements::statements;
pub use statements::{AccountSql, Statements};
pub use tenants::{Branding, KeyRotation, TenantRecord, TenantStatements};
use tokens::supersede_verification;
pub use tokens::{ConsumedToken, NewToken, ReturnTo, TokenForSend, TokenStatements, live_token};
pub use users::{
    InviteAcceptance, LoginUser, SignupCounted, SignupOutcome, SignupRow, User, UserStatements,
};

/// Runs `query` on the pool, a statement of its own: the rows it changed.
async fn changed<B>(
    db: &Db<B::Database>,
    query: sqlx::query::Query<'_, B::Database, <B::Database as sqlx::Database>::Arguments>,
) -> Result<u64, AccountError>
where
    B: Backend,
    <B::Database as sqlx::Database>::Arguments: IntoArguments<B::Database>,
    for<'c> &'c Db<B::Database>: Executor<'c, Database = B::Database>,
{
    let done = query.execute(db).await.map_err(AccountError::of)?;
    Ok(B::rows_affected(&done))
}

/// Runs a key rotation's statement, `query` with the row's id and the new key bound, on the
/// pool (binding the grace in seconds and now): `None` if there was no row to rotate, else until
/// when the replaced key keeps working.
async fn rotation<B>(
    db: &Db<B::Database>,
    query: sqlx::query::QueryAs<
        '_,
        B::Database,
        (Option<i64>,),
        <B::Database as sqlx::Database>::Arguments,
    >,
    grace: std::time::Duration,
) -> Result<Option<KeyRotation>, AccountError>
where
    B: Backend,
    <B::Database as sqlx::Database>::Arguments: IntoArguments<B::Database>,
    for<'c> &'c Db<B::Database>: Executor<'c, Database = B::Database>,
    for<'q> f64: Encode<'q, B::Database> + Type<B::Database>,
    for<'r> (Option<i64>,): FromRow<'r, <B::Database as sqlx::Database>::Row>,
{
    let rotated = query
        .bind(grace.as_secs_f64())
        .bind(B::at(None))
        .fetch_optional(db)
        .await
        .map_err(AccountError::of)?;
    Ok(rotated.map(|(until,)| KeyRotation {
        previous_valid_until: until.map(from_millis),
    }))
}

/// [`Accounts::count_email`]'s statement, bound: run on a transaction's connection or, for
/// [`Accounts::count_on_pool`], on the pool.
fn count_email_statement<'q, B>(
    tenant: &'q str,
    bucket: &'q str,
    window_start: i64,
) -> sqlx::query::QueryScalar<'q, B::Database, i64, <B::Database as sqlx::Database>::Arguments>
where
    B: AccountSql,
    for<'a> &'a str: Encode<'a, B::Database> + Type<B::Database>,
    for<'a> i64: Encode<'a, B::Database> + Type<B::Database>,
    for<'r> (i64,): FromRow<'r, <B::Database as sqlx::Database>::Row>,
{
    sqlx::query_scalar(B::ACCOUNT_SQL.limits.count_email)
        .bind(tenant)
        .bind(bucket)
        .bind(window_start)
}

/// A moment read as Unix milliseconds.
pub fn from_millis(ms: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// Why account storage failed: a row that exists already, a database that cannot serve now, or
/// anything else.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    /// A unique constraint refused the row: what it names exists already (a tenant's name).
    #[error("it exists already")]
    Conflict(#[source] sqlx::Error),
    /// The database cannot serve now: unreachable, shutting down, out of connections, its
    /// write lock (SQLite) or a row lock another transaction holds (PostgreSQL) not free in
    /// time. Nothing was changed; try again later.
    #[error("the database is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// The database refused the statement for another reason.
    #[error("database error")]
    Database(#[source] sqlx::Error),
    /// A row the statement needs is not there (only a concurrent delete could cause it).
    #[error("{0}")]
    Vanished(&'static str),
}

impl AccountError {
    /// Sorts an error of the database.
    pub fn of(error: sqlx::Error) -> Self {
        // A read-only answer discards the connections to that server; a lost one has the
        // primary looked for again.
        oncely_sql::notice(&error);
        let unique = matches!(&error, sqlx::Error::Database(e) if e.is_unique_violation());
        if unique {
            Self::Conflict(error)
        } else if crate::backend::cannot_serve_now(&error) {
            Self::Unavailable(error)
        } else {
            Self::Database(error)
        }
    }
}

/// The account flows' storage on one [`Backend`]. Handlers run the associated functions
/// inside the idempotency layer's transaction (`conn`); the worker and the CLI use the pool
/// (`&self`).
///
/// Written once, for every backend whose database sqlx can bind and read these types (the
/// `where` clause of the one `impl` below: `B: Accounts` holds for PostgreSQL and SQLite). The
/// statements come from [`AccountSql::ACCOUNT_SQL`]; the Rust that binds their parameters and reads
/// their rows is this. (Generic rather than a macro per dialect: the bounds fit in one `where`
/// clause, and code that only needs account storage asks for `A: Accounts` without repeating
/// them.) The readiness check, which reads the migration tables the same way, lives here too.
pub trait Accounts: Backend {
    /// Inserts the user if the (tenant, address) is new, then reads it back (both statements
    /// run either way: the same work for new and known addresses). A concurrent insert of the
    /// same address waits for the other transaction (the unique index).
    ///
    /// The account gets no password here: a password chosen at signup travels with that
    /// signup's verification token ([`NewToken::password_hash`]) and takes effect only when the
    /// address owner verifies with that token and re-enters it ([`Self::mark_verified`]).
    fn signup_user<'c>(
        conn: &'c mut Connection<Self>,
        tenant: &'c str,
        email: &'c EmailAddress,
        source: Option<&'c str>,
    ) -> impl Future<Output = Result<SignupOutcome, AccountError>> + Send + 'c;

    /// A signup's writes before its link, in one statement where the dialect can: the user (as
    /// [`Self::signup_user`]), the email's per-address counters (as [`Self::count_email_pair`],
    /// or [`Self::count_email`] of the address alone if `count.pair` is `None`), and the
    /// tenant's webhook endpoints read (as [`Self::webhook_targets`]) for its event.
    fn signup_user_counted<'c>(
        conn: &'c mut Connection<Self>,
        tenant: &'c str,
        email: &'c EmailAddress,
        source: Option<&'c str>,
        count: &'c MailCount,
    ) -> impl Future<Output = Result<SignupCounted, AccountError>> + Send + 'c;

    /// The user with this address in this tenant.
    fn find_user<'c>(
        conn: &'c mut Connection<Self>,
        tenant: &'c str,
        email: &'c EmailAddress,
    ) -> impl Future<Output = Result<Option<User>, AccountError>> + Send + 'c;

    /// The user with this address (as stored) in this tenant, its row locked until the
    /// transaction ends (on PostgreSQL; SQLite's transaction holds the write lock): what it
    /// says about the account stays true until the caller commits.
    fn lock_user<'c>(
        conn: &'c mut Connection<Self>,
        tenant: &'c str,
        email: &'c str,
    ) -> impl Future<Output = Result<Option<User>, AccountError>> + Send + 'c;

    /// Counts one more email for `bucket` in the window starting at `window_start`; returns
    /// the count including this one.
    fn count_email<'c>(
        conn: &'c mut Connection<Self>,
        tenant: &'c str,
        bucket: &'c str,
        window_start: i64,
    ) -> impl Future<Output = Result<i64, AccountError>> + Send + 'c;

    /// Counts one more email to an address from a client (`buckets.0`) and, if that count is
    /// within `per_address` and `client_allowed`, one more to the address (`buckets.1`);
    /// returns both counts (the second `None` if not counted). One statement where the dialect
    /// can.
    fn count_email_pair<'c>(
        conn: &'c mut Connection<Self>,
        tenant: &'c str,
        buckets: (&'c str, &'c str),
        window_start: i64,
        caps: (i64, bool),
    ) -> impl Future<Output = Result<(i64, Option<i64>), AccountError>> + Send + 'c;

    /// The user with this address in this tenant, with its password hash (on the pool: a
    /// login writes nothing in the request's transaction).
    fn login_user(
        &self,
        tenant: &str,
        email: &EmailAddress,
    ) -> impl Future<Output = Result<Option<LoginUser>, AccountError>> + Send;

    /// [`Self::count_email`] in a statement of its own on the pool: the count survives the
    /// request's rollback (the idempotency layer rolls back a 401's transaction).
    fn count_on_pool(
        &self,
        tenant: &str,
        bucket: &str,
        window_start: i64,
    ) -> impl Future<Output = Result<i64, AccountError>> + Send;

    /// Takes back one count of `bucket` in the window starting at `window_start` (on the pool).
    fn uncount(
        &self,
        tenant: &str,
        bucket: &str,
        window_start: i64,
    ) -> impl Future<Output = Result<(), AccountError>> + Send;

    /// Replaces a user's password hash `old` by `new` unless it changed meanwhile (a reset
    /// wins); whether it replaced it. On the pool.
    fn rehash_password(
        &self,
        user_id: Uuid,
        old: &str,
        new: &str,
    ) -> impl Future<Output = Result<bool, AccountError>> + Send;

    /// Stores a token (its hash), first superseding the user's live tokens of the same flow if
    /// asked (the statement runs either way).
    fn insert_token<'c>(
        conn: &'c mut Connection<Self>,
        token: &'c NewToken<'c>,
    ) -> impl Future<Output = Result<(), AccountError>> + Send + 'c;

    /// Consumes a live, owned token of `flow`, found by its hash (unique across tenants). The
    /// token names its tenant; `tenant`, when the request proved one with an API key, must be
    /// that tenant (a token of tenant A is useless with tenant B's key).
    fn consume_token<'c>(
        conn: &'c mut Connection<Self>,
        tenant: Option<&'c str>,
        flow: &'c str,
        hash: &'c [u8],
    ) -> impl Future<Output = Result<Option<ConsumedToken>, AccountError>> + Send + 'c;

    /// Counts one attempt at re-entering the password of the live verification token with this
    /// hash (in `tenant`, if given) and returns the password hash its signup chose, if any, and
    /// the attempts so far; `None` if there is no such token. On the pool, before the request's
    /// transaction: checking a password never holds it, and the count survives a rollback.
    fn signup_password_attempt(
        &self,
        tenant: Option<&str>,
        hash: &[u8],
    ) -> impl Future<Output = Result<Option<(Option<String>, i64)>, AccountError>> + Send;

    /// Takes back an attempt at a verification token's signup password whose check did not run
    /// (every password hasher busy): only checks that ran count toward the token's limit.
    fn signup_password_unattempt(
        &self,
        hash: &[u8],
    ) -> impl Future<Output = Result<(), AccountError>> + Send;

    /// Marks a pending user's address verified and sets its password to `password_hash` —
    /// `None` clears whatever a pending account held (a release before 0004, or a process of
    /// that release still running beside this one, wrote signup passwords on the account: the
    /// owner's proof of the address must not adopt it). A verified account is left alone: its
    /// password changes only through a reset. When it verifies, it supersedes the user's other
    /// live verification tokens (a signup link that carries someone's password must not set it
    /// later). Returns whether the account went from pending to verified now (a
    /// `user.verified` event). The used link's `locale` becomes the account's (`None`: none):
    /// what a pending account held came from a signup whose address nobody had proven, maybe a
    /// stranger's.
    fn mark_verified<'c>(
        conn: &'c mut Connection<Self>,
        user_id: Uuid,
        password_hash: Option<&'c str>,
        locale: Option<&'c str>,
    ) -> impl Future<Output = Result<bool, AccountError>> + Send + 'c;

    /// Replaces a user's password hash.
    fn set_password<'c>(
        conn: &'c mut Connection<Self>,
        user_id: Uuid,
        password_hash: &'c str,
    ) -> impl Future<Output = Result<(), AccountError>> + Send + 'c;

    /// Accepts an invite: creates the user (verified: the invite proved the address) or marks
    /// the existing one verified (superseding its live verification tokens; a pending account
    /// gets the invitee's password or none, never the one it held), and adds the tenant
    /// membership once. Says whether the account was created, or verified, now: the account
    /// is read locked first, and a concurrent signup of the address that commits meanwhile is
    /// read again, so each change is reported by exactly one transaction. A created or pending
    /// account gets the invitation's `locale`; a verified one keeps its own (or gets it if it
    /// has none).
    fn accept_invite<'c>(
        conn: &'c mut Connection<Self>,
        tenant: &'c str,
        email: &'c str,
        password_hash: Option<&'c str>,
        locale: Option<&'c str>,
    ) -> impl Future<Output = Result<InviteAcceptance, AccountError>> + Send + 'c;

    /// The address of user `user_id` if it belongs to `tenant` (else `None`: unknown, or
    /// another tenant's).
    fn user_in_tenant<'c>(
        conn: &'c mut Connection<Self>,
        tenant: &'c str,
        user_id: Uuid,
    ) -> impl Future<Output = Result<Option<String>, AccountError>> + Send + 'c;

    /// Gives user `user_id` the address `email`, verified, and supersedes every live token of
    /// the user (links to the old address, and other change links); `false`, changing nothing,
    /// if another account of its tenant has the address — found by the statement, or by the
    /// unique index when a concurrent transaction took it (on PostgreSQL that aborts the
    /// transaction: the caller must roll back).
    fn change_email<'c>(
        conn: &'c mut Connection<Self>,
        user_id: Uuid,
        email: &'c str,
    ) -> impl Future<Output = Result<bool, AccountError>> + Send + 'c;

    /// Supersedes every live link of user `user_id` (its invitations too if `invites`): after
    /// a password reset no other reset, magic-link, verification or email-change link of the
    /// account works — a change an intruder asked for ends when the owner resets.
    fn end_links<'c>(
        conn: &'c mut Connection<Self>,
        user_id: Uuid,
        invites: bool,
    ) -> impl Future<Output = Result<(), AccountError>> + Send + 'c;

    /// The flow, recipient and liveness of a token (for the worker, outside any transaction).
    fn token_for_send(
        &self,
        token_id: Uuid,
    ) -> impl Future<Output = Result<Option<TokenForSend>, AccountError>> + Send;

    /// The address of a user (for the worker).
    fn user_email(
        &self,
        user_id: Uuid,
    ) -> impl Future<Output = Result<Option<String>, AccountError>> + Send;

    /// The address of a user and the locale its emails are written in (for the worker): none
    /// while the account is pending (a stranger's signup may have named it).
    fn user_email_and_locale(
        &self,
        user_id: Uuid,
    ) -> impl Future<Output = Result<Option<(String, Option<String>)>, AccountError>> + Send;

    /// Deletes up to `limit` tokens that expired more than `expired_for` before `now` (`None`:
    /// the database's clock) — used, superseded, decoys and unused alike; returns how many.
    fn prune_tokens(
        &self,
        now: Option<OffsetDateTime>,
        expired_for: std::time::Duration,
        limit: u32,
    ) -> impl Future<Output = Result<u64, AccountError>> + Send;

    /// Deletes up to `limit` email-cap counters of windows that started before `before_window`
    /// (Unix seconds); returns how many.
    fn prune_rate_limits(
        &self,
        before_window: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, AccountError>> + Send;

    /// Creates a tenant with the hash of its API key; [`AccountError::Conflict`] if the name
    /// (or the key) is taken.
    fn create_tenant(
        &self,
        id: &str,
        api_key_hash: &[u8],
    ) -> impl Future<Output = Result<(), AccountError>> + Send;

    /// The tenant whose API key hashes to `api_key_hash`: its current key, or its previous
    /// one until that key's grace period ends.
    fn tenant_by_key(
        &self,
        api_key_hash: &[u8],
    ) -> impl Future<Output = Result<Option<String>, AccountError>> + Send;

    /// Replaces tenant `id`'s API key by the one hashing to `api_key_hash`. With a `grace`
    /// above zero the replaced key keeps working until now + `grace` (a previous key it kept
    /// from an earlier rotation stops); else it stops at once. `None` if there is no such
    /// tenant.
    fn rotate_tenant_key(
        &self,
        id: &str,
        api_key_hash: &[u8],
        grace: std::time::Duration,
    ) -> impl Future<Output = Result<Option<KeyRotation>, AccountError>> + Send;

    /// Stores a code (its hash) for the token consumed in this transaction; `false` (nothing
    /// stored) if the token's return URL is no longer one of its tenant's: removing a URL with
    /// `oncely tenant set` stops links already sent from returning there.
    fn insert_code<'c>(
        conn: &'c mut Connection<Self>,
        code: &'c NewCode<'c>,
    ) -> impl Future<Output = Result<bool, AccountError>> + Send + 'c;

    /// Consumes the live code of `tenant` with this hash, once: one statement, so of concurrent
    /// exchanges exactly one gets it. `None`: unknown, used, expired or another tenant's.
    fn exchange_code<'c>(
        conn: &'c mut Connection<Self>,
        tenant: &'c str,
        hash: &'c [u8],
    ) -> impl Future<Output = Result<Option<ExchangedCode>, AccountError>> + Send + 'c;

    /// Whether `tenant` has a code with this hash whose lifetime has not ended, used or not.
    fn code_live(
        &self,
        tenant: &str,
        hash: &[u8],
    ) -> impl Future<Output = Result<bool, AccountError>> + Send;

    /// Deletes up to `limit` codes that expired before `now` (`None`: the database's clock);
    /// returns how many.
    fn prune_codes(
        &self,
        now: Option<OffsetDateTime>,
        limit: u32,
    ) -> impl Future<Output = Result<u64, AccountError>> + Send;

    /// The return URLs of `tenant`, in order (none for an unknown tenant or `default`).
    fn return_urls(
        &self,
        tenant: &str,
    ) -> impl Future<Output = Result<Vec<String>, AccountError>> + Send;

    /// Every tenant's return URLs: `(tenant, url)`, by tenant and in order.
    fn all_return_urls(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, String)>, AccountError>> + Send;

    /// Replaces the return URLs of tenant `id` by `urls` (in order), in one transaction;
    /// `false` if there is no such tenant (nothing changed).
    fn set_return_urls(
        &self,
        id: &str,
        urls: &[String],
    ) -> impl Future<Output = Result<bool, AccountError>> + Send;

    /// The enabled webhook endpoints of `tenant`, oldest first, in the caller's transaction:
    /// `(id, events)`, `events` a JSON array of event types (`[]`: every event).
    fn webhook_targets<'c>(
        conn: &'c mut Connection<Self>,
        tenant: &'c str,
    ) -> impl Future<Output = Result<Vec<(Uuid, String)>, AccountError>> + Send + 'c;

    /// The enabled webhook endpoints of `tenant`, as [`Accounts::webhook_targets`] but on the
    /// pool (an email job's follow-ups read them outside any transaction).
    fn webhook_targets_now(
        &self,
        tenant: &str,
    ) -> impl Future<Output = Result<Vec<(Uuid, String)>, AccountError>> + Send;

    /// How `tenant`'s emails go out: `mail` or `webhook` (`mail` for an unknown tenant and
    /// `default`).
    fn email_delivery(
        &self,
        tenant: &str,
    ) -> impl Future<Output = Result<String, AccountError>> + Send;

    /// Tenant `tenant`'s branding (all `None` for an unknown tenant and `default`).
    fn branding(&self, tenant: &str)
    -> impl Future<Output = Result<Branding, AccountError>> + Send;

    /// Replaces tenant `id`'s branding; `false` if there is no such tenant.
    fn set_branding(
        &self,
        id: &str,
        branding: &Branding,
    ) -> impl Future<Output = Result<bool, AccountError>> + Send;

    /// Sets how tenant `id`'s emails go out (`mail` or `webhook`); `false` if there is no such
    /// tenant.
    fn set_email_delivery(
        &self,
        id: &str,
        delivery: &str,
    ) -> impl Future<Output = Result<bool, AccountError>> + Send;

    /// Stores a webhook endpoint (its secret already sealed).
    fn insert_webhook_endpoint(
        &self,
        endpoint: NewEndpoint<'_>,
    ) -> impl Future<Output = Result<(), AccountError>> + Send;

    /// Webhook endpoint `id` (on the pool: the worker reads it at every attempt).
    fn webhook_endpoint(
        &self,
        id: Uuid,
    ) -> impl Future<Output = Result<Option<EndpointRecord>, AccountError>> + Send;

    /// The webhook endpoints of `tenant` (`None`: of every tenant), by tenant, oldest first.
    fn webhook_endpoints(
        &self,
        tenant: Option<&str>,
    ) -> impl Future<Output = Result<Vec<EndpointRecord>, AccountError>> + Send;

    /// Disables endpoint `id` for `reason` (`None`: enables it again); `false` if there is no
    /// such endpoint.
    fn set_webhook_disabled(
        &self,
        id: Uuid,
        reason: Option<&str>,
    ) -> impl Future<Output = Result<bool, AccountError>> + Send;

    /// Gives endpoint `id` the signing secret `secret_sealed`; with a `grace` above zero the
    /// replaced one keeps signing until now + `grace` (a previous one kept from an earlier
    /// rotation stops), else it stops at once. `None` if there is no such endpoint.
    fn rotate_webhook_secret(
        &self,
        id: Uuid,
        secret_sealed: &str,
        grace: std::time::Duration,
    ) -> impl Future<Output = Result<Option<KeyRotation>, AccountError>> + Send;

    /// Replaces endpoint `id`'s current or previous sealed signing secret that is still `old`
    /// by `new` (the same secret sealed under the current server secret); `false` if neither is
    /// `old` any more.
    fn reseal_webhook_secret(
        &self,
        id: Uuid,
        old: &str,
        new: &str,
    ) -> impl Future<Output = Result<bool, AccountError>> + Send;

    /// Deletes endpoint `id` (its pending deliveries end dead at their next attempt); `false`
    /// if there is no such endpoint.
    fn remove_webhook_endpoint(
        &self,
        id: Uuid,
    ) -> impl Future<Output = Result<bool, AccountError>> + Send;

    /// Every tenant (but `default`, which has no row), by id.
    fn tenants(&self) -> impl Future<Output = Result<Vec<TenantRecord>, AccountError>> + Send;

    /// One number: the first column of the first row of `sql` (readiness, the demo's counts).
    fn scalar(&self, sql: String) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;

    /// Ready to serve: reachable, and every migration this binary knows is applied.
    fn ready(&self) -> impl Future<Output = anyhow::Result<()>> + Send {
        async move {
            for (table, migrator) in MIGRATION_TABLES.into_iter().zip(Self::migrators()) {
                let latest = migrator.iter().map(|m| m.version).max().unwrap_or(0);
                let applied = self
                    .scalar(format!(
                        "SELECT COALESCE(MAX(version), 0) FROM {table} WHERE success"
                    ))
                    .await?;
                if applied < latest {
                    anyhow::bail!(
                        "migrations pending in {table}: database at {applied}, binary expects {latest}"
                    );
                }
            }
            Ok(())
        }
    }
}

/// The one implementation. The bounds say: sqlx can run statements on a connection and on the
/// pool of `B`'s database, bind these parameter types, and read these rows.
impl<B> Accounts for B
where
    B: AccountSql,
    for<'c> &'c mut Connection<B>: Executor<'c, Database = B::Database>,
    <B::Database as sqlx::Database>::Arguments: IntoArguments<B::Database>,
    for<'q> Uuid: Encode<'q, B::Database> + Type<B::Database>,
    for<'q> Option<Uuid>: Encode<'q, B::Database>,
    for<'q> &'q str: Encode<'q, B::Database> + Type<B::Database>,
    for<'q> Option<&'q str>: Encode<'q, B::Database>,
    for<'q> &'q [u8]: Encode<'q, B::Database> + Type<B::Database>,
    for<'q> bool: Encode<'q, B::Database> + Type<B::Database>,
    for<'q> i64: Encode<'q, B::Database> + Type<B::Database>,
    for<'q> f64: Encode<'q, B::Database> + Type<B::Database>,
    for<'r> User: FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> SignupRow: FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> LoginUser: FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> ConsumedToken: FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> TokenForSend: FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> (Option<String>, i64): FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> (i64, Option<i64>): FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> (i64,): FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> (Uuid,): FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> (String,): FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> (Option<i64>,): FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> TenantRecord: FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> EndpointRecord: FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> ExchangedCode: FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> (String, String): FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> (String, Option<String>, String): FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> (Uuid, String): FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> (String, Option<String>): FromRow<'r, <B::Database as sqlx::Database>::Row>,
    for<'r> Branding: FromRow<'r, <B::Database as sqlx::Database>::Row>,
{
    async fn signup_user(
        conn: &mut Connection<B>,
        tenant: &str,
        email: &EmailAddress,
        source: Option<&str>,
    ) -> Result<SignupOutcome, AccountError> {
        let new_id = Uuid::new_v4();
        let inserted: Option<Uuid> = sqlx::query_scalar(B::ACCOUNT_SQL.users.insert_user)
            .bind(new_id)
            .bind(tenant)
            .bind(email.as_str())
            .bind(source)
            .bind(B::at(None))
            .fetch_optional(&mut *conn)
            .await
            .map_err(AccountError::of)?;
        if inserted == Some(new_id) {
            return Ok(SignupOutcome::Created(new_id));
        }
        let user = Self::find_user(conn, tenant, email)
            .await?
            .ok_or(AccountError::Vanished("user vanished"))?;
        Ok(match user {
            User { id, .. } if id == new_id => SignupOutcome::Created(id),
            User { id, verified: true } => SignupOutcome::Verified(id),
            User {
                id,
                verified: false,
            } => SignupOutcome::Pending(id),
        })
    }

    async fn signup_user_counted(
        conn: &mut Connection<B>,
        tenant: &str,
        email: &EmailAddress,
        source: Option<&str>,
        count: &MailCount,
    ) -> Result<SignupCounted, AccountError> {
        let Some(sql) = B::ACCOUNT_SQL.users.signup_user_counted else {
            let outcome = Self::signup_user(&mut *conn, tenant, email, source).await?;
            let targets = Self::webhook_targets(&mut *conn, tenant).await?;
            let counts = count_in::<B>(conn, tenant, count).await?;
            return Ok(SignupCounted {
                outcome,
                counts,
                targets,
            });
        };
        let new_id = Uuid::new_v4();
        let row: SignupRow = sqlx::query_as(sql)
            .bind(new_id)
            .bind(tenant)
            .bind(email.as_str())
            .bind(source)
            .bind(B::at(None))
            .bind(count.pair.as_deref())
            .bind(count.address.as_str())
            .bind(count.window_start)
            .bind(count.per_address)
            .bind(count.client_allowed)
            .fetch_one(&mut *conn)
            .await
            .map_err(AccountError::of)?;
        let outcome = match (row.inserted, row.found, row.verified) {
            (Some(id), _, _) if id == new_id => SignupOutcome::Created(id),
            (_, Some(id), Some(true)) => SignupOutcome::Verified(id),
            (_, Some(id), _) => SignupOutcome::Pending(id),
            // The address was inserted by a transaction that committed after this statement's
            // snapshot (the insert waited for it): read it now.
            _ => match Self::find_user(conn, tenant, email)
                .await?
                .ok_or(AccountError::Vanished("user vanished"))?
            {
                User { id, verified: true } => SignupOutcome::Verified(id),
                User { id, .. } => SignupOutcome::Pending(id),
            },
        };
        let targets = match row.targets {
            None => Vec::new(),
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| AccountError::Database(sqlx::Error::Decode(Box::new(e))))?,
        };
        Ok(SignupCounted {
            outcome,
            counts: (row.from_client, row.to_address),
            targets,
        })
    }

    async fn find_user(
        conn: &mut Connection<B>,
        tenant: &str,
        email: &EmailAddress,
    ) -> Result<Option<User>, AccountError> {
        sqlx::query_as(B::ACCOUNT_SQL.users.find_user)
            .bind(tenant)
            .bind(email.as_str())
            .fetch_optional(conn)
            .await
            .map_err(AccountError::of)
    }

    async fn lock_user(
        conn: &mut Connection<B>,
        tenant: &str,
        email: &str,
    ) -> Result<Option<User>, AccountError> {
        sqlx::query_as(B::ACCOUNT_SQL.users.lock_user)
            .bind(tenant)
            .bind(email)
            .fetch_optional(conn)
            .await
            .map_err(AccountError::of)
    }

    async fn count_email(
        conn: &mut Connection<B>,
        tenant: &str,
        bucket: &str,
        window_start: i64,
    ) -> Result<i64, AccountError> {
        count_email_statement::<B>(tenant, bucket, window_start)
            .fetch_one(conn)
            .await
            .map_err(AccountError::of)
    }

    async fn count_email_pair(
        conn: &mut Connection<B>,
        tenant: &str,
        (pair, address): (&str, &str),
        window_start: i64,
        (per_address, client_allowed): (i64, bool),
    ) -> Result<(i64, Option<i64>), AccountError> {
        if let Some(sql) = B::ACCOUNT_SQL.limits.count_email_pair {
            return sqlx::query_as(sql)
                .bind(tenant)
                .bind(pair)
                .bind(address)
                .bind(window_start)
                .bind(per_address)
                .bind(client_allowed)
                .fetch_one(conn)
                .await
                .map_err(AccountError::of);
        }
        let from_client = Self::count_email(&mut *conn, tenant, pair, window_start).await?;
        if from_client > per_address || !client_allowed {
            return Ok((from_client, None));
        }
        let to_address = Self::count_email(conn, tenant, address, window_start).await?;
        Ok((from_client, Some(to_address)))
    }

    async fn login_user(
        &self,
        tenant: &str,
        email: &EmailAddress,
    ) -> Result<Option<LoginUser>, AccountError> {
        sqlx::query_as(B::ACCOUNT_SQL.users.login_user)
            .bind(tenant)
            .bind(email.as_str())
            .fetch_optional(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn count_on_pool(
        &self,
        tenant: &str,
        bucket: &str,
        window_start: i64,
    ) -> Result<i64, AccountError> {
        count_email_statement::<B>(tenant, bucket, window_start)
            .fetch_one(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn uncount(
        &self,
        tenant: &str,
        bucket: &str,
        window_start: i64,
    ) -> Result<(), AccountError> {
        sqlx::query(B::ACCOUNT_SQL.limits.uncount)
            .bind(tenant)
            .bind(bucket)
            .bind(window_start)
            .execute(self.db())
            .await
            .map_err(AccountError::of)?;
        Ok(())
    }

    async fn rehash_password(
        &self,
        user_id: Uuid,
        old: &str,
        new: &str,
    ) -> Result<bool, AccountError> {
        let query = sqlx::query(B::ACCOUNT_SQL.users.rehash_password)
            .bind(user_id)
            .bind(old)
            .bind(new);
        Ok(changed::<B>(self.db(), query).await? == 1)
    }

    async fn insert_token(
        conn: &mut Connection<B>,
        token: &NewToken<'_>,
    ) -> Result<(), AccountError> {
        let now = || B::at(None);
        // The insert's parameters, in `insert_token`'s order (the one-statement form adds
        // `supersede` after them): the URL, and whether it is the tenant's first instead.
        let insert = |sql| {
            sqlx::query(sql)
                .bind(token.id)
                .bind(token.tenant)
                .bind(token.user_id)
                .bind(token.email)
                .bind(token.flow)
                .bind(token.hash)
                .bind(B::at(Some(token.expires_at)))
                .bind(now())
                .bind(token.password_hash)
                .bind(match token.return_to {
                    ReturnTo::Url(url) => Some(url),
                    ReturnTo::Nowhere | ReturnTo::TenantsFirst => None,
                })
                .bind(token.locale)
                .bind(token.return_to == ReturnTo::TenantsFirst)
        };
        if let Some(sql) = B::ACCOUNT_SQL.tokens.supersede_and_insert_token {
            insert(sql)
                .bind(token.supersede)
                .execute(conn)
                .await
                .map_err(AccountError::of)?;
            return Ok(());
        }
        sqlx::query(B::ACCOUNT_SQL.tokens.supersede_flow)
            .bind(token.user_id)
            .bind(token.flow)
            .bind(token.supersede)
            .bind(now())
            .execute(&mut *conn)
            .await
            .map_err(AccountError::of)?;
        insert(B::ACCOUNT_SQL.tokens.insert_token)
            .execute(conn)
            .await
            .map_err(AccountError::of)?;
        Ok(())
    }

    async fn consume_token(
        conn: &mut Connection<B>,
        tenant: Option<&str>,
        flow: &str,
        hash: &[u8],
    ) -> Result<Option<ConsumedToken>, AccountError> {
        // The account first (see `lock_token_account`), so that two links of one account used
        // at once do not deadlock.
        sqlx::query(B::ACCOUNT_SQL.tokens.lock_token_account)
            .bind(hash)
            .execute(&mut *conn)
            .await
            .map_err(AccountError::of)?;
        sqlx::query_as(B::ACCOUNT_SQL.tokens.consume_token)
            .bind(hash)
            .bind(tenant)
            .bind(flow)
            .bind(B::at(None))
            .fetch_optional(conn)
            .await
            .map_err(AccountError::of)
    }

    async fn signup_password_attempt(
        &self,
        tenant: Option<&str>,
        hash: &[u8],
    ) -> Result<Option<(Option<String>, i64)>, AccountError> {
        // Its own statement on the pool: the count survives the request's rollback.
        sqlx::query_as(B::ACCOUNT_SQL.tokens.signup_password_attempt)
            .bind(hash)
            .bind(tenant)
            .bind(B::at(None))
            .fetch_optional(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn signup_password_unattempt(&self, hash: &[u8]) -> Result<(), AccountError> {
        sqlx::query(B::ACCOUNT_SQL.tokens.signup_password_unattempt)
            .bind(hash)
            .execute(self.db())
            .await
            .map_err(AccountError::of)?;
        Ok(())
    }

    async fn mark_verified(
        conn: &mut Connection<B>,
        user_id: Uuid,
        password_hash: Option<&str>,
        locale: Option<&str>,
    ) -> Result<bool, AccountError> {
        let updated = sqlx::query(B::ACCOUNT_SQL.users.mark_verified)
            .bind(user_id)
            .bind(B::at(None))
            .bind(password_hash)
            .bind(locale)
            .execute(&mut *conn)
            .await
            .map_err(AccountError::of)?;
        // An account verified before has no live verification links to end.
        if B::rows_affected(&updated) == 0 {
            return Ok(false);
        }
        supersede_verification::<B>(conn, user_id).await?;
        Ok(true)
    }

    async fn set_password(
        conn: &mut Connection<B>,
        user_id: Uuid,
        password_hash: &str,
    ) -> Result<(), AccountError> {
        sqlx::query(B::ACCOUNT_SQL.users.set_password)
            .bind(user_id)
            .bind(password_hash)
            .execute(conn)
            .await
            .map_err(AccountError::of)?;
        Ok(())
    }

    async fn accept_invite(
        conn: &mut Connection<B>,
        tenant: &str,
        email: &str,
        password_hash: Option<&str>,
        locale: Option<&str>,
    ) -> Result<InviteAcceptance, AccountError> {
        let now = || B::at(None);
        let new_id = Uuid::new_v4();
        // Both statements take the invitation's fields in this order.
        let invitation = |sql: &'static str| {
            sqlx::query(sql)
                .bind(new_id)
                .bind(tenant)
                .bind(email)
                .bind(password_hash)
                .bind(now())
                .bind(locale)
        };
        let mut found = Self::lock_user(conn, tenant, email).await?;
        if found.is_none() {
            let inserted = invitation(B::ACCOUNT_SQL.users.insert_invited_user)
                .execute(&mut *conn)
                .await
                .map_err(AccountError::of)?;
            if B::rows_affected(&inserted) == 0 {
                // A concurrent signup (or invitation) committed the address meanwhile: what it
                // left, locked now.
                found = Some(
                    Self::lock_user(conn, tenant, email)
                        .await?
                        .ok_or(AccountError::Vanished("invited user vanished"))?,
                );
            }
        }
        let id = match found {
            // Created just now, verified: nothing to update.
            None => new_id,
            Some(_) => {
                let row = invitation(B::ACCOUNT_SQL.users.accept_invite)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(AccountError::of)?;
                let (id,) = <(Uuid,)>::from_row(&row).map_err(AccountError::of)?;
                id
            }
        };
        sqlx::query(B::ACCOUNT_SQL.users.add_membership)
            .bind(tenant)
            .bind(id)
            .bind(now())
            .execute(&mut *conn)
            .await
            .map_err(AccountError::of)?;
        supersede_verification::<B>(conn, id).await?;
        Ok(InviteAcceptance {
            user_id: id,
            created: found.is_none(),
            verified: found.is_some_and(|user| !user.verified),
        })
    }

    async fn user_in_tenant(
        conn: &mut Connection<B>,
        tenant: &str,
        user_id: Uuid,
    ) -> Result<Option<String>, AccountError> {
        sqlx::query_scalar(B::ACCOUNT_SQL.users.user_in_tenant)
            .bind(user_id)
            .bind(tenant)
            .fetch_optional(conn)
            .await
            .map_err(AccountError::of)
    }

    async fn change_email(
        conn: &mut Connection<B>,
        user_id: Uuid,
        email: &str,
    ) -> Result<bool, AccountError> {
        let changed = sqlx::query(B::ACCOUNT_SQL.users.change_email)
            .bind(user_id)
            .bind(email)
            .bind(B::at(None))
            .execute(&mut *conn)
            .await
            .map_err(AccountError::of);
        match changed {
            Ok(done) if B::rows_affected(&done) == 1 => {}
            // Taken: by a committed account (no row), or by a concurrent one (the index).
            Ok(_) | Err(AccountError::Conflict(_)) => return Ok(false),
            Err(error) => return Err(error),
        }
        Self::end_links(conn, user_id, true).await?;
        Ok(true)
    }

    async fn end_links(
        conn: &mut Connection<B>,
        user_id: Uuid,
        invites: bool,
    ) -> Result<(), AccountError> {
        sqlx::query(B::ACCOUNT_SQL.tokens.supersede_user_tokens)
            .bind(user_id)
            .bind(B::at(None))
            .bind(invites)
            .execute(conn)
            .await
            .map_err(AccountError::of)?;
        Ok(())
    }

    async fn token_for_send(&self, token_id: Uuid) -> Result<Option<TokenForSend>, AccountError> {
        sqlx::query_as(B::ACCOUNT_SQL.tokens.token_for_send)
            .bind(token_id)
            .bind(B::at(None))
            .fetch_optional(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn user_email(&self, user_id: Uuid) -> Result<Option<String>, AccountError> {
        sqlx::query_scalar(B::ACCOUNT_SQL.users.user_email)
            .bind(user_id)
            .fetch_optional(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn user_email_and_locale(
        &self,
        user_id: Uuid,
    ) -> Result<Option<(String, Option<String>)>, AccountError> {
        let row: Option<(String, Option<String>)> =
            sqlx::query_as(B::ACCOUNT_SQL.users.user_email_and_locale)
                .bind(user_id)
                .fetch_optional(self.db())
                .await
                .map_err(AccountError::of)?;
        Ok(row)
    }

    async fn prune_tokens(
        &self,
        now: Option<OffsetDateTime>,
        expired_for: std::time::Duration,
        limit: u32,
    ) -> Result<u64, AccountError> {
        let query = sqlx::query(B::ACCOUNT_SQL.tokens.prune_tokens)
            .bind(B::at(now))
            .bind(expired_for.as_secs_f64())
            .bind(i64::from(limit));
        changed::<B>(self.db(), query).await
    }

    async fn prune_rate_limits(&self, before_window: i64, limit: u32) -> Result<u64, AccountError> {
        let query = sqlx::query(B::ACCOUNT_SQL.limits.prune_rate_limits)
            .bind(before_window)
            .bind(i64::from(limit));
        changed::<B>(self.db(), query).await
    }

    async fn create_tenant(&self, id: &str, api_key_hash: &[u8]) -> Result<(), AccountError> {
        sqlx::query(B::ACCOUNT_SQL.tenants.create_tenant)
            .bind(id)
            .bind(api_key_hash)
            .bind(B::at(None))
            .execute(self.db())
            .await
            .map_err(AccountError::of)?;
        Ok(())
    }

    async fn tenant_by_key(&self, api_key_hash: &[u8]) -> Result<Option<String>, AccountError> {
        sqlx::query_scalar(B::ACCOUNT_SQL.tenants.tenant_by_key)
            .bind(api_key_hash)
            .bind(B::at(None))
            .fetch_optional(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn rotate_tenant_key(
        &self,
        id: &str,
        api_key_hash: &[u8],
        grace: std::time::Duration,
    ) -> Result<Option<KeyRotation>, AccountError> {
        let query = sqlx::query_as(B::ACCOUNT_SQL.tenants.rotate_tenant_key)
            .bind(id)
            .bind(api_key_hash);
        rotation::<B>(self.db(), query, grace).await
    }

    async fn insert_code(
        conn: &mut Connection<B>,
        code: &NewCode<'_>,
    ) -> Result<bool, AccountError> {
        let done = sqlx::query(B::ACCOUNT_SQL.codes.insert_code)
            .bind(code.hash)
            .bind(code.token_hash)
            .bind(code.user_id)
            .bind(code.lifetime.as_secs_f64())
            .execute(conn)
            .await
            .map_err(AccountError::of)?;
        Ok(B::rows_affected(&done) == 1)
    }

    async fn exchange_code(
        conn: &mut Connection<B>,
        tenant: &str,
        hash: &[u8],
    ) -> Result<Option<ExchangedCode>, AccountError> {
        sqlx::query_as(B::ACCOUNT_SQL.codes.exchange_code)
            .bind(hash)
            .bind(tenant)
            .bind(B::at(None))
            .fetch_optional(conn)
            .await
            .map_err(AccountError::of)
    }

    async fn code_live(&self, tenant: &str, hash: &[u8]) -> Result<bool, AccountError> {
        let live: Option<i64> = sqlx::query_scalar(B::ACCOUNT_SQL.codes.code_live)
            .bind(hash)
            .bind(tenant)
            .bind(B::at(None))
            .fetch_optional(self.db())
            .await
            .map_err(AccountError::of)?;
        Ok(live.is_some())
    }

    async fn prune_codes(
        &self,
        now: Option<OffsetDateTime>,
        limit: u32,
    ) -> Result<u64, AccountError> {
        let query = sqlx::query(B::ACCOUNT_SQL.codes.prune_codes)
            .bind(B::at(now))
            .bind(i64::from(limit));
        changed::<B>(self.db(), query).await
    }

    async fn return_urls(&self, tenant: &str) -> Result<Vec<String>, AccountError> {
        sqlx::query_scalar(B::ACCOUNT_SQL.tenants.return_urls)
            .bind(tenant)
            .fetch_all(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn all_return_urls(&self) -> Result<Vec<(String, String)>, AccountError> {
        sqlx::query_as(B::ACCOUNT_SQL.tenants.all_return_urls)
            .fetch_all(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn set_return_urls(&self, id: &str, urls: &[String]) -> Result<bool, AccountError> {
        let mut tx = self
            .db()
            .begin_with(B::BEGIN_WRITE)
            .await
            .map_err(AccountError::of)?;
        let found: Option<String> = sqlx::query_scalar(B::ACCOUNT_SQL.tenants.lock_tenant)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(AccountError::of)?;
        if found.is_none() {
            return Ok(false);
        }
        sqlx::query(B::ACCOUNT_SQL.tenants.clear_return_urls)
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(AccountError::of)?;
        for (position, url) in (0_i64..).zip(urls) {
            sqlx::query(B::ACCOUNT_SQL.tenants.add_return_url)
                .bind(id)
                .bind(position)
                .bind(url.as_str())
                .execute(&mut *tx)
                .await
                .map_err(AccountError::of)?;
        }
        tx.commit().await.map_err(AccountError::of)?;
        Ok(true)
    }

    async fn webhook_targets(
        conn: &mut Connection<B>,
        tenant: &str,
    ) -> Result<Vec<(Uuid, String)>, AccountError> {
        sqlx::query_as(B::ACCOUNT_SQL.endpoints.webhook_targets)
            .bind(tenant)
            .fetch_all(&mut *conn)
            .await
            .map_err(AccountError::of)
    }

    async fn webhook_targets_now(&self, tenant: &str) -> Result<Vec<(Uuid, String)>, AccountError> {
        sqlx::query_as(B::ACCOUNT_SQL.endpoints.webhook_targets)
            .bind(tenant)
            .fetch_all(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn email_delivery(&self, tenant: &str) -> Result<String, AccountError> {
        let found: Option<String> = sqlx::query_scalar(B::ACCOUNT_SQL.tenants.email_delivery)
            .bind(tenant)
            .fetch_optional(self.db())
            .await
            .map_err(AccountError::of)?;
        Ok(found.unwrap_or_else(|| "mail".to_owned()))
    }

    async fn branding(&self, tenant: &str) -> Result<Branding, AccountError> {
        let found: Option<Branding> = sqlx::query_as(B::ACCOUNT_SQL.tenants.branding)
            .bind(tenant)
            .fetch_optional(self.db())
            .await
            .map_err(AccountError::of)?;
        Ok(found.unwrap_or_default())
    }

    async fn set_branding(&self, id: &str, branding: &Branding) -> Result<bool, AccountError> {
        let query = sqlx::query(B::ACCOUNT_SQL.tenants.set_branding)
            .bind(id)
            .bind(branding.product_name.as_deref())
            .bind(branding.mail_from.as_deref())
            .bind(branding.support_email.as_deref());
        Ok(changed::<B>(self.db(), query).await? == 1)
    }

    async fn set_email_delivery(&self, id: &str, delivery: &str) -> Result<bool, AccountError> {
        let query = sqlx::query(B::ACCOUNT_SQL.tenants.set_email_delivery)
            .bind(id)
            .bind(delivery);
        Ok(changed::<B>(self.db(), query).await? == 1)
    }

    async fn insert_webhook_endpoint(&self, endpoint: NewEndpoint<'_>) -> Result<(), AccountError> {
        sqlx::query(B::ACCOUNT_SQL.endpoints.insert_webhook_endpoint)
            .bind(endpoint.id)
            .bind(endpoint.tenant)
            .bind(endpoint.url)
            .bind(endpoint.events)
            .bind(endpoint.secret_sealed)
            .bind(B::at(None))
            .execute(self.db())
            .await
            .map_err(AccountError::of)?;
        Ok(())
    }

    async fn webhook_endpoint(&self, id: Uuid) -> Result<Option<EndpointRecord>, AccountError> {
        sqlx::query_as(B::ACCOUNT_SQL.endpoints.webhook_endpoint)
            .bind(id)
            .bind(B::at(None))
            .fetch_optional(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn webhook_endpoints(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<EndpointRecord>, AccountError> {
        sqlx::query_as(B::ACCOUNT_SQL.endpoints.webhook_endpoints)
            .bind(tenant)
            .bind(B::at(None))
            .fetch_all(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn set_webhook_disabled(
        &self,
        id: Uuid,
        reason: Option<&str>,
    ) -> Result<bool, AccountError> {
        let query = sqlx::query(B::ACCOUNT_SQL.endpoints.set_webhook_disabled)
            .bind(id)
            .bind(B::at(None))
            .bind(reason);
        Ok(changed::<B>(self.db(), query).await? == 1)
    }

    async fn reseal_webhook_secret(
        &self,
        id: Uuid,
        old: &str,
        new: &str,
    ) -> Result<bool, AccountError> {
        let query = sqlx::query(B::ACCOUNT_SQL.endpoints.reseal_webhook_secret)
            .bind(id)
            .bind(old)
            .bind(new);
        Ok(changed::<B>(self.db(), query).await? > 0)
    }

    async fn rotate_webhook_secret(
        &self,
        id: Uuid,
        secret_sealed: &str,
        grace: std::time::Duration,
    ) -> Result<Option<KeyRotation>, AccountError> {
        let query = sqlx::query_as(B::ACCOUNT_SQL.endpoints.rotate_webhook_secret)
            .bind(id)
            .bind(secret_sealed);
        rotation::<B>(self.db(), query, grace).await
    }

    async fn remove_webhook_endpoint(&self, id: Uuid) -> Result<bool, AccountError> {
        let query = sqlx::query(B::ACCOUNT_SQL.endpoints.remove_webhook_endpoint).bind(id);
        Ok(changed::<B>(self.db(), query).await? == 1)
    }

    async fn tenants(&self) -> Result<Vec<TenantRecord>, AccountError> {
        sqlx::query_as(B::ACCOUNT_SQL.tenants.tenants)
            .bind(B::at(None))
            .fetch_all(self.db())
            .await
            .map_err(AccountError::of)
    }

    async fn scalar(&self, sql: String) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(self.db())
            .await
    }
}
