//! The SQLite key store: [`SqliteKeyStore`], the embedded default.
//!
//! Its statements are in `sql.rs`; the Rust it shares with PostgreSQL in `store::sql`. Here are
//! the steps that differ. SQLite has one writer at a time, so every claim runs in a
//! `BEGIN IMMEDIATE` transaction: the insert, the read and the takeover are one atomic step. Its
//! write lock is one for the whole database, so a claim that finds it busy cannot tell from the
//! database whether a request with the same key holds it or any other writer does; the store
//! can ([`HeldScopes`]), since one process owns a SQLite file.

mod sql;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use oncely_sql::Db;
use sqlx::migrate::Migrator;
use sqlx::sqlite::SqliteQueryResult;
use sqlx::{Sqlite, SqliteConnection, Transaction};

use super::sql::{ClaimArgs, Dialect, InsertOrRead, Queries, Statements, millis, statements};
use super::{Claim, ClaimRequest, Clock, SqlKeyStore, StoreError};
use crate::Scope;

pub use super::sql::MIGRATIONS_TABLE;

/// A [`KeyStore`](super::KeyStore) on SQLite. Times come from this process's clock unless
/// [`with_clock`](SqlKeyStore::with_clock) injects one.
///
/// Open the pool in WAL mode with a busy timeout (see [`connect_options`]).
pub type SqliteKeyStore = SqlKeyStore<Sqlite>;

/// Options that suit this store: WAL (readers never block the writer), `synchronous = NORMAL`
/// (durable at each checkpoint, safe against application crashes), a busy timeout, foreign keys,
/// and the file created if missing.
pub use oncely_sql::open::connect_options;

/// This store's migrations, for callers that run them with their own tooling.
pub fn migrator() -> Migrator {
    super::sql::with_history_table(sqlx::migrate!("migrations/sqlite"))
}

fn is_busy(err: &sqlx::Error) -> bool {
    // SQLITE_BUSY and its extended codes (5, 261, 517, …): the write lock was not free in time.
    matches!(err, sqlx::Error::Database(e)
        if e.code().and_then(|c| c.parse::<i32>().ok()).is_some_and(|c| c & 0xff == 5))
}

/// Begins a write transaction at once (`BEGIN IMMEDIATE`): the claim's steps are atomic.
async fn begin_immediate(db: &Db<Sqlite>) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
    db.begin_with("BEGIN IMMEDIATE").await
}

/// The scopes this process holds in open transactional claims, each with how many claims
/// hold it.
#[derive(Debug, Clone, Default)]
pub struct HeldScopes(Arc<Mutex<HashMap<Scope, usize>>>);

impl HeldScopes {
    fn hold(&self, scope: &Scope) -> HeldScope {
        *self.lock().entry(scope.clone()).or_default() += 1;
        HeldScope {
            scopes: self.clone(),
            scope: scope.clone(),
        }
    }

    fn is_held(&self, scope: &Scope) -> bool {
        self.lock().contains_key(scope)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Scope, usize>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One entry of [`HeldScopes`]; dropped with its transaction (commit or rollback).
struct HeldScope {
    scopes: HeldScopes,
    scope: Scope,
}

impl Drop for HeldScope {
    fn drop(&mut self) {
        let mut map = self.scopes.lock();
        if let Some(n) = map.get_mut(&self.scope) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.scope);
            }
        }
    }
}

impl super::sql::sealed::Sealed for Sqlite {}

impl Dialect for Sqlite {
    const STATEMENTS: Statements = statements!(sql);

    type Now = i64;

    type Held = HeldScopes;

    fn now(clock: &Clock) -> Self::Now {
        clock
            .now()
            .duration_since(UNIX_EPOCH)
            .map(millis)
            .unwrap_or(0)
    }

    fn migrator() -> Migrator {
        migrator()
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn claim(store: &SqliteKeyStore, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let mut tx = match begin_immediate(store.db()).await {
            Ok(tx) => tx,
            Err(e) if is_busy(&e) => return Err(StoreError::Busy),
            Err(e) => return Err(e.into()),
        };
        let claim = Self::claim_on(&mut tx, req, store.clock()).await?;
        tx.commit().await?;
        Ok(claim)
    }

    async fn begin_claim(
        db: &Db<Sqlite>,
        _: &ClaimRequest<'_>,
        _wait: Duration,
    ) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        // One writer at a time: a concurrent owner of the same key holds the write lock until it
        // commits, so waiting for the lock (the pool's busy timeout) may be waiting for that
        // owner — or for any other writer (see `contended`).
        begin_immediate(db).await
    }

    async fn insert_or_read(
        conn: &mut SqliteConnection,
        args: &ClaimArgs<'_, Self>,
    ) -> Result<InsertOrRead, StoreError> {
        if Self::execute_claim(conn, Self::STATEMENTS.claim, args).await? {
            return Ok(InsertOrRead::Inserted);
        }
        let row = Self::select(conn, args.scope(), args.now()).await?;
        row.map(InsertOrRead::Found)
            .ok_or(StoreError::Corrupt("key row vanished during claim"))
    }

    fn contended<T>(
        held: &HeldScopes,
        scope: &Scope,
        error: sqlx::Error,
    ) -> Result<Claim<T>, StoreError> {
        if !is_busy(&error) {
            return Err(error.into());
        }
        // The write lock stayed busy. A transaction of this store holds the key: the wait for a
        // concurrent owner of this key ran out. Otherwise the database is busy as a whole, which
        // says nothing about the key.
        if held.is_held(scope) {
            Ok(Claim::Busy)
        } else {
            Err(StoreError::Busy)
        }
    }

    fn hold(held: &HeldScopes, scope: &Scope) -> impl Send + 'static {
        held.hold(scope)
    }
}
