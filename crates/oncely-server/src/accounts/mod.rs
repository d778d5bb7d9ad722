//! Account storage: one trait, written once per database dialect, used inside the
//! idempotency layer's transaction.

use std::future::Future;

use oncely::store::KeyStore;
use sqlx::Database;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::email::EmailAddress;

pub mod postgres;
pub mod sqlite;

/// The service's migrations (its own history table, `_oncely_server_migrations`).
pub(crate) fn migrator_of(steps: &[(i64, &'static str, &'static str)]) -> sqlx::migrate::Migrator {
    use sqlx::SqlSafeStr;
    use sqlx::migrate::{Migration, MigrationType, Migrator};
    let migrations = steps
        .iter()
        .map(|(version, description, sql)| {
            Migration::new(
                *version,
                (*description).into(),
                MigrationType::Simple,
                sql.into_sql_str(),
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name("_oncely_server_migrations");
    // Migrations only add: a process of the previous release must still start (and restart)
    // on a database a newer release already migrated, so versions it does not know are fine.
    migrator.set_ignore_missing(true);
    migrator
}

/// What a signup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignupRow {
    /// A new account.
    Created(Uuid),
    /// The address has an account that is not verified yet.
    Pending(Uuid),
    /// The address has a verified account.
    Verified(Uuid),
}

/// A user found by address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserRow {
    /// The user.
    pub id: Uuid,
    /// Whether the address is verified.
    pub verified: bool,
}

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
}

/// A token that was consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedToken {
    /// The tenant the token was issued in (a link names its tenant through its token).
    pub tenant: String,
    /// The password hash a signup stored with its verification token, if any.
    pub password_hash: Option<String>,
    /// Its user, if it had one.
    pub user_id: Option<Uuid>,
    /// Its address (invites).
    pub email: Option<String>,
}

/// What the worker needs to send a token's email.
#[derive(Debug, Clone)]
pub struct TokenForSend {
    /// The flow.
    pub flow: String,
    /// The recipient: the user's address, or the invited one; `None` for a decoy.
    pub recipient: Option<String>,
    /// Still usable (not consumed, not superseded, not expired).
    pub live: bool,
    /// SHA-256 of the token: tells which server secret (current or previous) derived it.
    pub hash: Vec<u8>,
}

/// The SQL of the account flows, for one database. Handlers run these inside the idempotency
/// layer's transaction (`conn`); the worker and the CLI use the pool (`&self`).
pub trait Accounts: KeyStore {
    /// The outbox store on the same database; handlers enqueue with it in their transaction.
    type Jobs: oncely_outbox::JobStore<Database = Self::Database>;

    /// A new outbox store on this database. The app makes one and shares it (on SQLite an
    /// enqueue wakes the workers of the store it went through).
    fn jobs(&self, poll_only: bool) -> Self::Jobs;

    /// Applies the service's own migrations.
    fn migrate_accounts(&self) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Inserts the user if the (tenant, address) is new, then reads it back (both statements
    /// run either way: the same work for new and known addresses). A concurrent insert of the
    /// same address waits for the other transaction (the unique index).
    ///
    /// The account gets no password here: a password chosen at signup travels with that
    /// signup's verification token ([`NewToken::password_hash`]) and takes effect only when the
    /// address owner verifies with that token and re-enters it ([`Self::mark_verified`]).
    fn signup_user<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        tenant: &'c str,
        email: &'c EmailAddress,
        source: Option<&'c str>,
    ) -> impl Future<Output = anyhow::Result<SignupRow>> + Send + 'c;

    /// The user with this address in this tenant.
    fn find_user<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        tenant: &'c str,
        email: &'c EmailAddress,
    ) -> impl Future<Output = anyhow::Result<Option<UserRow>>> + Send + 'c;

    /// Counts one more email for `bucket` in the window starting at `window_start`; returns
    /// the count including this one.
    fn count_email<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        tenant: &'c str,
        bucket: &'c str,
        window_start: i64,
    ) -> impl Future<Output = anyhow::Result<i64>> + Send + 'c;

    /// Stores a token (its hash), first superseding the user's live tokens of the same flow if
    /// asked (the statement runs either way).
    fn insert_token<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        token: &'c NewToken<'c>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send + 'c;

    /// Consumes a live, owned token of `flow`, found by its hash (unique across tenants). The
    /// token names its tenant; `tenant`, when the request proved one with an API key, must be
    /// that tenant (a token of tenant A is useless with tenant B's key).
    fn consume_token<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        tenant: Option<&'c str>,
        flow: &'c str,
        hash: &'c [u8],
    ) -> impl Future<Output = anyhow::Result<Option<ConsumedToken>>> + Send + 'c;

    /// Counts one attempt at re-entering the password of the live verification token with this
    /// hash (in `tenant`, if given) and returns the password hash its signup chose, if any, and
    /// the attempts so far; `None` if there is no such token. On the pool, before the request's
    /// transaction: checking a password never holds it, and the count survives a rollback.
    fn signup_password_attempt(
        &self,
        tenant: Option<&str>,
        hash: &[u8],
    ) -> impl Future<Output = anyhow::Result<Option<(Option<String>, i64)>>> + Send;

    /// Marks a pending user's address verified and sets its password to `password_hash` —
    /// `None` clears whatever a pending account held (a release before 0004, or a process of
    /// that release still running beside this one, wrote signup passwords on the account: the
    /// owner's proof of the address must not adopt it). A verified account is left alone: its
    /// password changes only through a reset. When it verifies, it supersedes the user's other
    /// live verification tokens (a signup link that carries someone's password must not set it
    /// later).
    fn mark_verified<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        user_id: Uuid,
        password_hash: Option<&'c str>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send + 'c;

    /// Replaces a user's password hash.
    fn set_password<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        user_id: Uuid,
        password_hash: &'c str,
    ) -> impl Future<Output = anyhow::Result<()>> + Send + 'c;

    /// Accepts an invite: creates the user (verified: the invite proved the address) or marks
    /// the existing one verified (superseding its live verification tokens; a pending account
    /// gets the invitee's password or none, never the one it held), and adds the tenant
    /// membership once.
    fn accept_invite<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        tenant: &'c str,
        email: &'c str,
        password_hash: Option<&'c str>,
    ) -> impl Future<Output = anyhow::Result<Uuid>> + Send + 'c;

    /// The flow, recipient and liveness of a token (for the worker, outside any transaction).
    fn token_for_send(
        &self,
        token_id: Uuid,
    ) -> impl Future<Output = anyhow::Result<Option<TokenForSend>>> + Send;

    /// The address of a user (for the worker).
    fn user_email(
        &self,
        user_id: Uuid,
    ) -> impl Future<Output = anyhow::Result<Option<String>>> + Send;

    /// Deletes up to `limit` tokens that expired more than `expired_for` ago (used, superseded,
    /// decoys and unused alike); returns how many.
    fn prune_tokens(
        &self,
        expired_for: std::time::Duration,
        limit: u32,
    ) -> impl Future<Output = anyhow::Result<u64>> + Send;

    /// Deletes up to `limit` email-cap counters of windows that started before `before_window`
    /// (Unix seconds); returns how many.
    fn prune_rate_limits(
        &self,
        before_window: i64,
        limit: u32,
    ) -> impl Future<Output = anyhow::Result<u64>> + Send;

    /// Creates a tenant with the hash of its API key; fails if the name is taken.
    fn create_tenant(
        &self,
        id: &str,
        api_key_hash: &[u8],
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// The tenant whose API key hashes to `api_key_hash`.
    fn tenant_by_key(
        &self,
        api_key_hash: &[u8],
    ) -> impl Future<Output = anyhow::Result<Option<String>>> + Send;
}
