//! The SQLite key store: the embedded default.
//!
//! SQLite has one writer at a time, so every claim runs in a `BEGIN IMMEDIATE` transaction:
//! the insert, the read and the takeover are one atomic step. Times are Unix milliseconds from
//! this process's clock (one machine owns the file). Each query names the index it uses in
//! `migrations/sqlite/0001_idempotency_keys.sql`.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{Row, SqlSafeStr, Sqlite, SqliteConnection, SqlitePool, Transaction};

use super::{
    Claim, ClaimRequest, Completion, FencingToken, KeyStore, Record, StoreError, millis,
    record_from_columns,
};
use crate::Scope;

/// The table that records which of this store's migrations ran (apart from other libraries').
pub const MIGRATIONS_TABLE: &str = "_oncely_idempotency_migrations";

/// A [`KeyStore`] on SQLite.
///
/// Open the pool in WAL mode with a busy timeout (see [`connect_options`]).
#[derive(Debug, Clone)]
pub struct SqliteKeyStore {
    pool: SqlitePool,
}

impl SqliteKeyStore {
    /// A store on `pool`. Call [`KeyStore::migrate`] once before use.
    pub fn new(pool: SqlitePool) -> Self {
        Self { pool }
    }

    /// The pool this store uses.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// Options that suit this store: WAL (readers never block the writer), `synchronous = NORMAL`
/// (durable at each checkpoint, safe against application crashes), a busy timeout, foreign keys,
/// and the file created if missing.
pub fn connect_options(url: &str) -> Result<sqlx::sqlite::SqliteConnectOptions, sqlx::Error> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    use std::str::FromStr;
    Ok(SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5))
        .foreign_keys(true))
}

/// This store's migrations, for callers that run them with their own tooling.
pub fn migrator() -> Migrator {
    let mut migrator = Migrator::with_migrations(vec![Migration::new(
        1,
        Cow::Borrowed("idempotency keys"),
        MigrationType::Simple,
        include_str!("../../migrations/sqlite/0001_idempotency_keys.sql").into_sql_str(),
        false,
    )]);
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    // Migrations only add: a process of the previous release must still start (and restart)
    // on a database a newer release already migrated, so versions it does not know are fine.
    migrator.set_ignore_missing(true);
    migrator
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

const INSERT: &str = "
    INSERT INTO oncely_idempotency_keys
        (tenant, method, route, idem_key, fingerprint, state, fence, lease_until, expires_at, created_at)
    VALUES (?1, ?2, ?3, ?4, ?5, 'in_progress', ?6, ?9 + ?7, ?9 + ?8, ?9)
    ON CONFLICT (tenant, method, route, idem_key) DO NOTHING";

const TAKEOVER: &str = "
    UPDATE oncely_idempotency_keys
       SET fingerprint = ?5, state = 'in_progress', fence = ?6, lease_until = ?9 + ?7,
           expires_at = ?9 + ?8, created_at = ?9,
           response_status = NULL, response_headers = NULL, response_body = NULL,
           tombstone_reason = NULL, completed_at = NULL
     WHERE tenant = ?1 AND method = ?2 AND route = ?3 AND idem_key = ?4
       AND (expires_at <= ?9
            OR (state = 'in_progress' AND lease_until <= ?9 AND fingerprint = ?5))";

const SELECT: &str = "
    SELECT fingerprint, state, COALESCE(lease_until > ?5, 0) AS lease_active,
           expires_at <= ?5 AS expired, response_status, response_headers, response_body,
           tombstone_reason
      FROM oncely_idempotency_keys
     WHERE tenant = ?1 AND method = ?2 AND route = ?3 AND idem_key = ?4";

const COMPLETE: &str = "
    UPDATE oncely_idempotency_keys
       SET state = ?6, response_status = ?7, response_headers = ?8, response_body = ?9,
           tombstone_reason = ?10, completed_at = ?11, lease_until = NULL
     WHERE tenant = ?1 AND method = ?2 AND route = ?3 AND idem_key = ?4
       AND fence = ?5 AND state = 'in_progress'";

const RENEW: &str = "
    UPDATE oncely_idempotency_keys
       SET lease_until = ?7 + ?6
     WHERE tenant = ?1 AND method = ?2 AND route = ?3 AND idem_key = ?4
       AND fence = ?5 AND state = 'in_progress'";

const RELEASE: &str = "
    DELETE FROM oncely_idempotency_keys
     WHERE tenant = ?1 AND method = ?2 AND route = ?3 AND idem_key = ?4
       AND fence = ?5 AND state = 'in_progress'";

// Index: oncely_idempotency_keys_expires_at.
const PRUNE: &str = "
    DELETE FROM oncely_idempotency_keys WHERE rowid IN (
        SELECT rowid FROM oncely_idempotency_keys
         WHERE expires_at <= ?1 AND (state <> 'in_progress' OR lease_until <= ?1)
         ORDER BY expires_at
         LIMIT ?2)";

struct Found {
    record: Record,
    expired: bool,
}

async fn select(
    conn: &mut SqliteConnection,
    scope: &Scope,
    now: i64,
) -> Result<Option<Found>, StoreError> {
    let row = sqlx::query(SELECT)
        .bind(scope.tenant.as_str())
        .bind(&scope.method)
        .bind(&scope.route)
        .bind(scope.key.as_str())
        .bind(now)
        .fetch_optional(conn)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let record = record_from_columns(
        row.try_get::<&[u8], _>("fingerprint")?,
        row.try_get("state")?,
        row.try_get("lease_active")?,
        row.try_get("response_status")?,
        row.try_get("response_headers")?,
        row.try_get("response_body")?,
        row.try_get("tombstone_reason")?,
    )?;
    Ok(Some(Found {
        record,
        expired: row.try_get("expired")?,
    }))
}

/// The claim algorithm, inside a `BEGIN IMMEDIATE` transaction (so it is atomic).
async fn claim_on(
    conn: &mut SqliteConnection,
    req: &ClaimRequest<'_>,
) -> Result<Claim, StoreError> {
    let scope = req.scope;
    let now = now_ms();
    let token = FencingToken::new();
    let args = |sql| {
        sqlx::query(sql)
            .bind(scope.tenant.as_str())
            .bind(&scope.method)
            .bind(&scope.route)
            .bind(scope.key.as_str())
            .bind(&req.fingerprint.as_bytes()[..])
            .bind(token.0)
            .bind(millis(req.lease))
            .bind(millis(req.retention))
            .bind(now)
    };
    if args(INSERT).execute(&mut *conn).await?.rows_affected() == 1 {
        return Ok(Claim::Acquired { token, tx: () });
    }
    let found = select(&mut *conn, scope, now)
        .await?
        .ok_or(StoreError::Corrupt("key row vanished during claim"))?;
    let claimable = found.record.claimable_by(req.fingerprint, found.expired);
    if claimable && args(TAKEOVER).execute(&mut *conn).await?.rows_affected() == 1 {
        return Ok(Claim::Acquired { token, tx: () });
    }
    Ok(Claim::Existing(found.record))
}

async fn complete_on(
    conn: &mut SqliteConnection,
    scope: &Scope,
    token: FencingToken,
    completion: &Completion,
) -> Result<bool, StoreError> {
    let c = completion.columns();
    let done = sqlx::query(COMPLETE)
        .bind(scope.tenant.as_str())
        .bind(&scope.method)
        .bind(&scope.route)
        .bind(scope.key.as_str())
        .bind(token.0)
        .bind(c.state)
        .bind(c.status)
        .bind(c.headers)
        .bind(c.body)
        .bind(c.reason)
        .bind(now_ms())
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

fn is_busy(err: &sqlx::Error) -> bool {
    // SQLITE_BUSY and its extended codes (5, 261, 517, …): the write lock was not free in time.
    matches!(err, sqlx::Error::Database(e)
        if e.code().and_then(|c| c.parse::<i32>().ok()).is_some_and(|c| c & 0xff == 5))
}

impl KeyStore for SqliteKeyStore {
    type Database = Sqlite;

    async fn migrate(&self) -> Result<(), StoreError> {
        migrator().run(&self.pool).await?;
        Ok(())
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let mut tx = match self.pool.begin_with("BEGIN IMMEDIATE").await {
            Ok(tx) => tx,
            Err(e) if is_busy(&e) => return Err(StoreError::Busy),
            Err(e) => return Err(e.into()),
        };
        let claim = claim_on(&mut tx, req).await?;
        tx.commit().await?;
        Ok(claim)
    }

    async fn complete(
        &self,
        scope: &Scope,
        token: FencingToken,
        completion: &Completion,
    ) -> Result<bool, StoreError> {
        let mut conn = self.pool.acquire().await?;
        complete_on(&mut conn, scope, token, completion).await
    }

    async fn renew(
        &self,
        scope: &Scope,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(RENEW)
            .bind(scope.tenant.as_str())
            .bind(&scope.method)
            .bind(&scope.route)
            .bind(scope.key.as_str())
            .bind(token.0)
            .bind(millis(lease))
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(&self, scope: &Scope, token: FencingToken) -> Result<bool, StoreError> {
        let done = sqlx::query(RELEASE)
            .bind(scope.tenant.as_str())
            .bind(&scope.method)
            .bind(&scope.route)
            .bind(scope.key.as_str())
            .bind(token.0)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        Ok(select(&mut conn, scope, now_ms())
            .await?
            .filter(|r| !r.expired)
            .map(|r| r.record))
    }

    async fn prune(&self, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(PRUNE)
            .bind(now_ms())
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn claim_in_transaction(
        &self,
        req: &ClaimRequest<'_>,
        _wait: Duration,
    ) -> Result<Claim<Transaction<'static, Sqlite>>, StoreError> {
        // One writer at a time: a concurrent owner of the same key holds the write lock until it
        // commits, so waiting for the lock (the pool's busy timeout) may be waiting for that
        // owner — or for any other writer. A lock still busy after the timeout therefore says
        // nothing about this key: StoreError::Busy, not Claim::Busy.
        let mut tx = match self.pool.begin_with("BEGIN IMMEDIATE").await {
            Ok(tx) => tx,
            Err(e) if is_busy(&e) => return Err(StoreError::Busy),
            Err(e) => return Err(e.into()),
        };
        match claim_on(&mut tx, req).await {
            Ok(Claim::Acquired { token, .. }) => Ok(Claim::Acquired { token, tx }),
            Ok(Claim::Existing(record)) => Ok(Claim::Existing(record)),
            Ok(Claim::Busy) => Ok(Claim::Busy),
            Err(StoreError::Database(e)) if is_busy(&e) => Err(StoreError::Busy),
            Err(e) => Err(e),
        }
    }

    async fn complete_in_transaction(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        scope: &Scope,
        token: FencingToken,
        completion: &Completion,
    ) -> Result<bool, StoreError> {
        complete_on(tx, scope, token, completion).await
    }
}
