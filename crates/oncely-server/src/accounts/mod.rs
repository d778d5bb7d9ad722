//! Account storage: one trait, written once per database dialect, used inside the
//! idempotency layer's transaction.

use std::future::Future;

use oncely::store::KeyStore;
use oncely_outbox::{Enqueued, NewJob, OutboxError};
use sqlx::Database;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::email::EmailAddress;

pub mod postgres;
pub mod sqlite;

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

/// A token to store (its hash only).
#[derive(Debug, Clone)]
pub struct NewToken<'a> {
    /// Random record id (the token is derived from it).
    pub id: Uuid,
    /// Owner tenant.
    pub tenant: &'a str,
    /// Owner user.
    pub user_id: Uuid,
    /// `verification`, …
    pub flow: &'a str,
    /// SHA-256 of the token.
    pub hash: &'a [u8],
    /// End of validity.
    pub expires_at: OffsetDateTime,
}

/// What the worker needs to send a token's email.
#[derive(Debug, Clone)]
pub struct TokenForSend {
    /// The recipient.
    pub email: String,
    /// Still usable (not consumed, not superseded, not expired).
    pub live: bool,
}

/// The SQL of the account flows, for one database.
pub trait Accounts: KeyStore {
    /// The outbox store on the same database.
    type Jobs: oncely_outbox::JobStore;

    /// A new outbox store on this database. The app makes one and shares it (workers and the
    /// post-commit wake-up must use the same one).
    fn jobs(&self, poll_only: bool) -> Self::Jobs;

    /// Applies the service's own migrations.
    fn migrate_accounts(&self) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Inserts the user if the (tenant, address) is new, else reports the existing one. A
    /// concurrent insert of the same address waits for the other transaction (the unique index).
    fn signup_user<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        tenant: &'c str,
        email: &'c EmailAddress,
        password_hash: Option<&'c str>,
        source: Option<&'c str>,
    ) -> impl Future<Output = anyhow::Result<SignupRow>> + Send + 'c;

    /// Stores a token, superseding the user's live tokens of the same flow.
    fn insert_token<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        token: &'c NewToken<'c>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send + 'c;

    /// Consumes a live token of `flow` for `tenant`; returns its user.
    fn consume_token<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        tenant: &'c str,
        flow: &'c str,
        hash: &'c [u8],
    ) -> impl Future<Output = anyhow::Result<Option<Uuid>>> + Send + 'c;

    /// Marks a user's address verified.
    fn mark_verified<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        user_id: Uuid,
    ) -> impl Future<Output = anyhow::Result<()>> + Send + 'c;

    /// Enqueues an outbox job in the transaction.
    fn enqueue<'c>(
        conn: &'c mut <Self::Database as Database>::Connection,
        job: &'c NewJob,
    ) -> impl Future<Output = Result<Enqueued, OutboxError>> + Send + 'c;

    /// The recipient and liveness of a token (for the worker, outside any transaction).
    fn token_for_send(
        &self,
        token_id: Uuid,
    ) -> impl Future<Output = anyhow::Result<Option<TokenForSend>>> + Send;

    /// The address of a user (for the worker).
    fn user_email(
        &self,
        user_id: Uuid,
    ) -> impl Future<Output = anyhow::Result<Option<String>>> + Send;

    /// Wakes in-process workers of `jobs` after a commit (SQLite); PostgreSQL NOTIFYs by itself.
    fn notify_workers(jobs: &Self::Jobs);
}
