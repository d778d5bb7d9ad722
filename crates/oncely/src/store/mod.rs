//! Durable key stores: one trait, one implementation on SQL databases, two dialects.
//!
//! The trait ([`KeyStore`]) speaks in scopes, fingerprints and stored responses; HTTP lives in
//! the layer. `SqlKeyStore<DB>` implements it once, for PostgreSQL (`postgres::PgKeyStore`,
//! feature `postgres`) and SQLite (`sqlite::SqliteKeyStore`, feature `sqlite`); each dialect
//! keeps its own statements (`store/<dialect>/sql.rs`) and migrations. Both pass the same
//! conformance suite (`tests/it/store_conformance.rs`). Times come from the store's [`Clock`]:
//! the real one by default, a [`ManualClock`] in tests.
//!
//! A key row moves through these states:
//!
//! ```text
//!            claim                     complete(token)
//!  (absent) ───────► in_progress ───────────────────────► completed ──┐
//!      ▲               │   │ lease expired: claim takes over          │ retention
//!      │               │   │ (renew(token) extends a live owner's lease)│
//!      │  release(token)│   └─► in_progress (new fencing token)      │ expired:
//!      └───────────────┘       complete(token, too large) ─► tombstoned ─► pruned
//! ```

use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use bytes::Bytes;
use uuid::Uuid;

use crate::{Fingerprint, Scope};

mod clock;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub mod shared_secret;
mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use clock::{Clock, ManualClock};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use sql::{Dialect, SqlKeyStore};

/// The response headers a stored result keeps and replays. Everything else (`Set-Cookie`,
/// `Authorization`, anything secret) is dropped before storage.
pub const REPLAYED_HEADERS: [&str; 4] = ["content-type", "location", "etag", "link"];

/// A fencing token: names one claim of a key. Completion and release succeed only with the token
/// of the current claim, so an owner whose lease expired and was taken over can no longer write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FencingToken(pub Uuid);

impl FencingToken {
    /// A fresh random token.
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }
}

impl Default for FencingToken {
    fn default() -> Self {
        Self::new()
    }
}

/// What a claim asks for.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The key's scope.
    pub scope: &'a Scope,
    /// The fingerprint of this request.
    pub fingerprint: &'a Fingerprint,
    /// How long the claim holds the key before another request may take it over.
    pub lease: Duration,
    /// How long the key's result is replayed, counted from this claim. (Fixed at claim time so
    /// that completing a key touches no indexed column.)
    pub retention: Duration,
}

/// A response as stored: status, allow-listed headers, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// `(name, value)` pairs, names lower case, only [`REPLAYED_HEADERS`].
    pub headers: Vec<(String, String)>,
    /// The body bytes.
    pub body: Bytes,
}

impl StoredResponse {
    /// Keeps the allow-listed headers of `headers`, drops the rest.
    pub fn new(status: u16, headers: &http::HeaderMap, body: Bytes) -> Self {
        let headers = headers
            .iter()
            .filter(|(name, _)| REPLAYED_HEADERS.contains(&name.as_str()))
            .filter_map(|(name, value)| {
                Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
            })
            .collect();
        Self {
            status,
            headers,
            body,
        }
    }
}

/// How a claimed key ends when its request has run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// Store the response; later requests replay it.
    Response(StoredResponse),
    /// The request ran but its result cannot be replayed (for example, the body was over the
    /// size limit): later requests get an error, never a second run.
    Tombstone {
        /// Why, for the error and for operators.
        reason: String,
    },
}

/// A key row that exists (and has not outlived its retention).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The fingerprint of the request that claimed the key.
    pub fingerprint: Fingerprint,
    /// Where it stands.
    pub state: RecordState,
    /// When its retention ends (then the key is free again), by [`KeyStore::now`]'s clock:
    /// the time of the read plus what the database said remained, so never later than the
    /// row's own expiry, whatever the skew between this process's clock and the database's.
    /// Set by [`KeyStore::get`]; a claim's [`Claim::Existing`] may leave it out.
    pub expires_at: Option<std::time::SystemTime>,
}

/// The state of a [`Record`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    /// A request holds the key under a lease.
    InProgress {
        /// Whether the lease is still running (an expired one can be taken over).
        lease_active: bool,
    },
    /// Finished: replay this.
    Completed(StoredResponse),
    /// Finished, not replayable.
    Tombstoned {
        /// Why.
        reason: String,
    },
}

/// The answer to a claim.
#[derive(Debug)]
pub enum Claim<T = ()> {
    /// This request now owns the key (new, retention expired, or an expired lease taken over).
    Acquired {
        /// The fencing token of this claim.
        token: FencingToken,
        /// The open transaction, for transactional claims.
        tx: T,
    },
    /// Someone else's row: in progress, completed or tombstoned; the caller compares fingerprints.
    Existing(Record),
    /// Transactional claims only: the bounded wait for a concurrent owner *of this key* ran out
    /// (PostgreSQL: the key's row stayed locked; SQLite: the write lock stayed busy while a
    /// transaction of this store held the key). A database that is busy as a whole (SQLite's
    /// write lock, held by another writer) is [`StoreError::Busy`] instead.
    Busy,
}

/// The open transaction of a transactional claim: write the business rows through it (it
/// dereferences to [`sqlx::Transaction`], and so to the connection), store the outcome in it
/// with [`KeyStore::complete_in_transaction`], then [`commit`](Self::commit). Dropping it rolls
/// back, which frees the key.
pub struct KeyTransaction<DB: sqlx::Database> {
    tx: sqlx::Transaction<'static, DB>,
    /// Ends with the transaction: what the store remembers of it while it is open (SQLite: the
    /// key's scope, see [`Claim::Busy`]).
    hold: Option<Box<dyn Send>>,
}

impl<DB: sqlx::Database> KeyTransaction<DB> {
    /// Wraps a transaction in which a key was claimed.
    pub fn new(tx: sqlx::Transaction<'static, DB>) -> Self {
        Self { tx, hold: None }
    }

    /// Wraps a transaction and something the store keeps until the transaction ends.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn holding(tx: sqlx::Transaction<'static, DB>, hold: impl Send + 'static) -> Self {
        Self {
            tx,
            hold: Some(Box::new(hold)),
        }
    }

    /// Commits the business rows and the stored outcome together.
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        let Self { tx, hold } = self;
        let committed = tx.commit().await;
        drop(hold);
        committed
    }

    /// Rolls back: nothing is stored, and the key is free again.
    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        let Self { tx, hold } = self;
        let rolled_back = tx.rollback().await;
        drop(hold);
        rolled_back
    }
}

impl<DB: sqlx::Database> Deref for KeyTransaction<DB> {
    type Target = sqlx::Transaction<'static, DB>;

    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl<DB: sqlx::Database> DerefMut for KeyTransaction<DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl<DB: sqlx::Database> fmt::Debug for KeyTransaction<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyTransaction").finish_non_exhaustive()
    }
}

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or could not be reached.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// The database is busy: its write lock (SQLite) was not free within the wait. Says
    /// nothing about the key; retry later.
    #[error("the database is busy")]
    Busy,
    /// A stored value could not be read back.
    #[error("stored {0} is corrupt")]
    Corrupt(&'static str),
    /// The database was migrated by a different version of this library.
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl From<sqlx::Error> for StoreError {
    /// Also tells [`oncely_sql::notice`] (a read-only answer: the connections to that server are
    /// discarded; a lost server: the primary is looked for again).
    fn from(error: sqlx::Error) -> Self {
        oncely_sql::notice(&error);
        StoreError::Database(error)
    }
}

/// A durable key store.
///
/// Two ways to use a key:
/// - *generic*: [`claim`](Self::claim) (its own short statement), run anything,
///   [`complete`](Self::complete) or [`release`](Self::release);
/// - *transactional*: [`claim_in_transaction`](Self::claim_in_transaction) opens a transaction
///   and claims inside it; the caller writes its business rows in the same transaction and
///   [`complete_in_transaction`](Self::complete_in_transaction) before committing, so the
///   business change and the stored result commit together (one commit per new request). A
///   rollback (or a crash) leaves the key free.
pub trait KeyStore: Clone + Send + Sync + 'static {
    /// The database the transactional mode hands to handlers.
    type Database: sqlx::Database;

    /// Creates or updates the store's tables (its own migration history table).
    fn migrate(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Atomically claims a key: inserts it in progress, or takes it over if its retention or
    /// (same fingerprint only) its lease has expired; otherwise returns the existing row.
    fn claim(
        &self,
        req: &ClaimRequest<'_>,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Stores the outcome of the claim `token`. `false` if that claim no longer owns the key.
    fn complete(
        &self,
        scope: &Scope,
        token: FencingToken,
        completion: &Completion,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Extends the lease of the claim `token` to `lease` from now (the store's [`Clock`]).
    /// Fenced: `false` unless the key is still in progress under that token, so an
    /// owner that was taken over learns it has lost the key. A live owner renews periodically,
    /// so only a dead owner's key is ever taken over.
    fn renew(
        &self,
        scope: &Scope,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Frees the key of the claim `token` (nothing is stored; a retry runs again).
    fn release(
        &self,
        scope: &Scope,
        token: FencingToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Reads a key's row, if it exists and is within retention.
    fn get(&self, scope: &Scope)
    -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// The time by which [`Record::expires_at`] is told: this process's clock, unless the store
    /// was given another ([`Clock`]).
    fn now(&self) -> std::time::SystemTime {
        std::time::SystemTime::now()
    }

    /// Deletes up to `limit` rows whose retention has passed (never an in-progress row with a
    /// running lease); returns how many. Call it repeatedly: each batch is short and skips rows
    /// other transactions hold.
    fn prune(&self, limit: u32) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Begins a transaction and claims the key inside it, waiting at most `wait` for a
    /// concurrent owner to finish ([`Claim::Busy`]) or for the database's write lock
    /// ([`StoreError::Busy`]). The transaction is bounded by `req.lease`.
    fn claim_in_transaction(
        &self,
        req: &ClaimRequest<'_>,
        wait: Duration,
    ) -> impl Future<Output = Result<Claim<KeyTransaction<Self::Database>>, StoreError>> + Send;

    /// Stores the outcome inside the claiming transaction; the caller commits.
    fn complete_in_transaction(
        &self,
        tx: &mut sqlx::Transaction<'static, Self::Database>,
        scope: &Scope,
        token: FencingToken,
        completion: &Completion,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// Prunes in batches of `batch` until nothing expired is left; returns the total deleted.
pub async fn prune_all<S: KeyStore>(store: &S, batch: u32) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let n = store.prune(batch).await?;
        total += n;
        if n < u64::from(batch) {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}
