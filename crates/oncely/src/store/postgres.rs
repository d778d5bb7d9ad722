//! The PostgreSQL key store.
//!
//! Each query names the index it uses in `migrations/postgres/0001_idempotency_keys.sql`.
//! Times come from the database clock (`now()`), so many API processes on many machines agree
//! on when a lease or a retention period ends.

use std::borrow::Cow;
use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Postgres, Row, SqlSafeStr, Transaction};

use super::{
    Claim, ClaimRequest, Completion, FencingToken, KeyStore, Record, StoreError, millis,
    record_from_columns,
};
use crate::Scope;

/// The table that records which of this store's migrations ran (apart from other libraries').
pub const MIGRATIONS_TABLE: &str = "_oncely_idempotency_migrations";

/// A [`KeyStore`] on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgKeyStore {
    pool: PgPool,
}

impl PgKeyStore {
    /// A store on `pool`. Call [`KeyStore::migrate`] once before use.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool this store uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// This store's migrations, for callers that run them with their own tooling.
pub fn migrator() -> Migrator {
    let mut migrator = Migrator::with_migrations(vec![Migration::new(
        1,
        Cow::Borrowed("idempotency keys"),
        MigrationType::Simple,
        include_str!("../../migrations/postgres/0001_idempotency_keys.sql").into_sql_str(),
        false,
    )]);
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    // Migrations only add: a process of the previous release must still start (and restart)
    // on a database a newer release already migrated, so versions it does not know are fine.
    migrator.set_ignore_missing(true);
    migrator
}

// Insert-or-read in one round trip: the insert takes no row lock and writes nothing when the key
// exists, and the read (from the statement's snapshot) returns the existing row. If a concurrent
// request committed the key after the snapshot was taken, neither part returns a row and the
// caller simply asks again.
const CLAIM: &str = "
    WITH inserted AS (
        INSERT INTO oncely_idempotency_keys
            (tenant, method, route, idem_key, fingerprint, state, fence, lease_until, expires_at)
        VALUES ($1, $2, $3, $4, $5, 'in_progress', $6,
                now() + make_interval(secs => $7), now() + make_interval(secs => $8))
        ON CONFLICT (tenant, method, route, idem_key) DO NOTHING
        RETURNING fence
    )
    SELECT true AS inserted, NULL::bytea AS fingerprint, NULL::text AS state, false AS lease_active,
           false AS expired, NULL::int8 AS response_status, NULL::text AS response_headers,
           NULL::bytea AS response_body, NULL::text AS tombstone_reason
      FROM inserted
    UNION ALL
    SELECT false, fingerprint, state, COALESCE(lease_until > now(), false), expires_at <= now(),
           response_status::int8, response_headers::text, response_body, tombstone_reason
      FROM oncely_idempotency_keys
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4
       AND NOT EXISTS (SELECT 1 FROM inserted)";

// Takes over a row whose retention ended, or whose lease ended (same request only). The guard
// is re-checked under the row lock, so of two racing takeovers exactly one wins.
const TAKEOVER: &str = "
    UPDATE oncely_idempotency_keys
       SET fingerprint = $5, state = 'in_progress', fence = $6,
           lease_until = now() + make_interval(secs => $7),
           expires_at = now() + make_interval(secs => $8), created_at = now(),
           response_status = NULL, response_headers = NULL, response_body = NULL,
           tombstone_reason = NULL, completed_at = NULL
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4
       AND (expires_at <= now()
            OR (state = 'in_progress' AND lease_until <= now() AND fingerprint = $5))
    RETURNING fence";

const SELECT: &str = "
    SELECT fingerprint, state, COALESCE(lease_until > now(), false) AS lease_active,
           expires_at <= now() AS expired, response_status::int8 AS response_status,
           response_headers::text AS response_headers, response_body, tombstone_reason
      FROM oncely_idempotency_keys
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4";

const COMPLETE: &str = "
    UPDATE oncely_idempotency_keys
       SET state = $6, response_status = $7, response_headers = $8::jsonb, response_body = $9,
           tombstone_reason = $10, completed_at = now(), lease_until = NULL
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4
       AND fence = $5 AND state = 'in_progress'";

const RENEW: &str = "
    UPDATE oncely_idempotency_keys
       SET lease_until = now() + make_interval(secs => $6)
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4
       AND fence = $5 AND state = 'in_progress'";

const RELEASE: &str = "
    DELETE FROM oncely_idempotency_keys
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4
       AND fence = $5 AND state = 'in_progress'";

// Index: oncely_idempotency_keys_expires_at. SKIP LOCKED: never waits for live traffic.
const PRUNE: &str = "
    DELETE FROM oncely_idempotency_keys WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM oncely_idempotency_keys
         WHERE expires_at <= now() AND (state <> 'in_progress' OR lease_until <= now())
         ORDER BY expires_at
         LIMIT $1
           FOR UPDATE SKIP LOCKED))";

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A row as read, with the two clock comparisons made by the database.
struct Found {
    record: Record,
    expired: bool,
}

async fn select(conn: &mut PgConnection, scope: &Scope) -> Result<Option<Found>, StoreError> {
    let row = sqlx::query(SELECT)
        .bind(scope.tenant.as_str())
        .bind(&scope.method)
        .bind(&scope.route)
        .bind(scope.key.as_str())
        .fetch_optional(conn)
        .await?;
    row.as_ref().map(found_from).transpose()
}

fn found_from(row: &sqlx::postgres::PgRow) -> Result<Found, StoreError> {
    let record = record_from_columns(
        row.try_get::<&[u8], _>("fingerprint")?,
        row.try_get("state")?,
        row.try_get("lease_active")?,
        row.try_get("response_status")?,
        row.try_get("response_headers")?,
        row.try_get("response_body")?,
        row.try_get("tombstone_reason")?,
    )?;
    Ok(Found {
        record,
        expired: row.try_get("expired")?,
    })
}

/// The claim algorithm, on any connection (autocommit or inside a transaction): insert-or-read
/// in one statement (a replay is one round trip and writes nothing); take over if allowed; loop
/// if the row changed underneath.
async fn claim_on(conn: &mut PgConnection, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
    let scope = req.scope;
    for _ in 0..8 {
        let token = FencingToken::new();
        let with_args = |sql| {
            sqlx::query(sql)
                .bind(scope.tenant.as_str())
                .bind(&scope.method)
                .bind(&scope.route)
                .bind(scope.key.as_str())
                .bind(&req.fingerprint.as_bytes()[..])
                .bind(token.0)
                .bind(secs(req.lease))
                .bind(secs(req.retention))
        };
        let Some(row) = with_args(CLAIM).fetch_optional(&mut *conn).await? else {
            continue; // raced with a concurrent commit: ask again
        };
        if row.try_get::<bool, _>("inserted")? {
            return Ok(Claim::Acquired { token, tx: () });
        }
        let found = found_from(&row)?;
        if !found.record.claimable_by(req.fingerprint, found.expired) {
            return Ok(Claim::Existing(found.record));
        }
        if with_args(TAKEOVER)
            .fetch_optional(&mut *conn)
            .await?
            .is_some()
        {
            return Ok(Claim::Acquired { token, tx: () });
        }
    }
    Err(StoreError::Corrupt("key row kept changing during claim"))
}

async fn complete_on(
    conn: &mut PgConnection,
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
        .bind(c.status.map(|s| s as i16))
        .bind(c.headers)
        .bind(c.body)
        .bind(c.reason)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

fn is_lock_timeout(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(e) if e.code().as_deref() == Some("55P03"))
}

impl KeyStore for PgKeyStore {
    type Database = Postgres;

    async fn migrate(&self) -> Result<(), StoreError> {
        migrator().run(&self.pool).await?;
        Ok(())
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let mut conn = self.pool.acquire().await?;
        claim_on(&mut conn, req).await
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
            .bind(secs(lease))
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
        Ok(select(&mut conn, scope)
            .await?
            .filter(|r| !r.expired)
            .map(|r| r.record))
    }

    async fn prune(&self, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(PRUNE)
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn claim_in_transaction(
        &self,
        req: &ClaimRequest<'_>,
        wait: Duration,
    ) -> Result<Claim<Transaction<'static, Postgres>>, StoreError> {
        // lock_timeout bounds the wait on a concurrent owner's uncommitted insert of the same
        // key (and later lock waits of the handler); the two session timeouts end a hung owner's
        // transaction after its lease, which frees the key for the next request.
        let begin = format!(
            "BEGIN; SET LOCAL lock_timeout = {}; SET LOCAL idle_in_transaction_session_timeout = {}; \
             SET LOCAL statement_timeout = {}",
            millis(wait).max(1),
            millis(req.lease).max(1),
            millis(req.lease).max(1),
        );
        let mut tx = self.pool.begin_with(AssertSqlSafe(begin)).await?;
        match claim_on(&mut tx, req).await {
            Ok(Claim::Acquired { token, .. }) => Ok(Claim::Acquired { token, tx }),
            Ok(Claim::Existing(record)) => Ok(Claim::Existing(record)),
            Ok(Claim::Busy) => Ok(Claim::Busy),
            Err(StoreError::Database(e)) if is_lock_timeout(&e) => Ok(Claim::Busy),
            Err(e) => Err(e),
        }
    }

    async fn complete_in_transaction(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        scope: &Scope,
        token: FencingToken,
        completion: &Completion,
    ) -> Result<bool, StoreError> {
        complete_on(tx, scope, token, completion).await
    }
}
