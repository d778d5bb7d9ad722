//! The outbox on SQLite: the embedded default. One writer at a time, so claims run in
//! `BEGIN IMMEDIATE` rather than with `SKIP LOCKED`; times are Unix milliseconds.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::migrate::Migrator;
use sqlx::sqlite::SqliteRow;
use sqlx::{AssertSqlSafe, Row, SqliteConnection, SqlitePool};
use time::OffsetDateTime;
use tokio::sync::Notify;
use uuid::Uuid;

use super::{Backlog, Finish, JobFilter, JobStore, OutboxError, Wakeup};
use crate::job::{AttemptRecord, Enqueued, Job, JobRecord, JobStatus, NewJob};

/// The table that records which of the outbox's migrations ran.
pub const MIGRATIONS_TABLE: &str = "_oncely_outbox_migrations";

/// The outbox's migrations.
pub fn migrator() -> Migrator {
    super::migrator_of(
        &[
            (
                1,
                "outbox",
                include_str!("../../migrations/sqlite/0001_outbox.sql"),
            ),
            (
                2,
                "skipped attempts",
                include_str!("../../migrations/sqlite/0002_skipped.sql"),
            ),
            (
                3,
                "prune index",
                include_str!("../../migrations/sqlite/0003_prune_index.sql"),
            ),
            (
                4,
                "due index by kind",
                include_str!("../../migrations/sqlite/0004_due_by_kind.sql"),
            ),
        ],
        MIGRATIONS_TABLE,
    )
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn to_ms(t: OffsetDateTime) -> i64 {
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

fn from_ms(ms: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// Enqueues `job` on `conn`, inside the caller's transaction. Call
/// [`SqliteJobStore::notify`] after the commit to wake an idle in-process worker at once
/// (otherwise it finds the job at its next poll).
pub async fn enqueue(conn: &mut SqliteConnection, job: &NewJob) -> Result<Enqueued, OutboxError> {
    let now = now_ms();
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO oncely_outbox (operation_key, kind, payload, delivery_key, not_after, run_after, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
         ON CONFLICT (operation_key) DO NOTHING
         RETURNING id",
    )
    .bind(&job.operation_key)
    .bind(&job.kind)
    .bind(job.payload.to_string())
    .bind(Uuid::new_v4())
    .bind(job.not_after.map(to_ms))
    .bind(now)
    .fetch_optional(conn)
    .await?;
    Ok(id.map_or(Enqueued::AlreadyExists, Enqueued::Inserted))
}

/// A [`JobStore`] on SQLite.
#[derive(Debug, Clone)]
pub struct SqliteJobStore {
    pool: SqlitePool,
    notify: Arc<Notify>,
}

impl SqliteJobStore {
    /// A store on `pool`.
    pub fn new(pool: SqlitePool) -> Self {
        Self {
            pool,
            notify: Arc::new(Notify::new()),
        }
    }

    /// Wakes an idle worker of this process (call after committing an enqueue).
    pub fn notify(&self) {
        self.notify.notify_waiters();
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

// Index: oncely_outbox_due_by_kind (partial, pending only).
const CLAIM: &str = "
    UPDATE oncely_outbox
       SET run_after = ?1 + ?2, lease_token = ?3, attempts = attempts + 1
     WHERE id IN (
        SELECT id FROM oncely_outbox
         WHERE status = 'pending' AND run_after <= ?1
           AND kind IN (SELECT value FROM json_each(?4))
         ORDER BY run_after, id
         LIMIT ?5)
    RETURNING id, operation_key, kind, payload, delivery_key, attempts, created_at, not_after";

fn job_from(row: &SqliteRow, lease_token: Uuid) -> Result<Job, OutboxError> {
    Ok(Job {
        id: row.try_get("id")?,
        operation_key: row.try_get("operation_key")?,
        kind: row.try_get("kind")?,
        payload: serde_json::from_str(row.try_get("payload")?)?,
        delivery_key: row.try_get("delivery_key")?,
        attempt: row.try_get("attempts")?,
        created_at: from_ms(row.try_get("created_at")?),
        not_after: row.try_get::<Option<i64>, _>("not_after")?.map(from_ms),
        lease_token,
    })
}

const RECORD_COLUMNS: &str = "id, operation_key, kind, status, attempts, last_error, provider_message_id, payload, delivery_key";

fn record_from(row: &SqliteRow) -> Result<JobRecord, OutboxError> {
    Ok(JobRecord {
        id: row.try_get("id")?,
        operation_key: row.try_get("operation_key")?,
        kind: row.try_get("kind")?,
        status: JobStatus::parse(row.try_get("status")?),
        attempts: row.try_get("attempts")?,
        last_error: row.try_get("last_error")?,
        provider_message_id: row.try_get("provider_message_id")?,
        payload: serde_json::from_str(row.try_get("payload")?)?,
        delivery_key: row.try_get("delivery_key")?,
    })
}

impl JobStore for SqliteJobStore {
    async fn migrate(&self) -> Result<(), OutboxError> {
        migrator().run(&self.pool).await?;
        Ok(())
    }

    async fn claim(
        &self,
        worker: &str,
        kinds: &[String],
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<Job>, OutboxError> {
        let token = Uuid::new_v4();
        let now = now_ms();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let rows = sqlx::query(CLAIM)
            .bind(now)
            .bind(ms(lease))
            .bind(token)
            .bind(serde_json::to_string(kinds)?)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        let mut jobs = rows
            .iter()
            .map(|row| job_from(row, token))
            .collect::<Result<Vec<_>, _>>()?;
        jobs.sort_by_key(|j| j.id);
        for job in &jobs {
            sqlx::query(
                "UPDATE oncely_outbox_attempts SET finished_at = ?2, result = 'abandoned',
                        error = 'the worker''s lease ended before the attempt finished'
                  WHERE job_id = ?1 AND finished_at IS NULL",
            )
            .bind(job.id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO oncely_outbox_attempts (job_id, attempt, worker, lease_token, started_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .bind(job.id)
            .bind(job.attempt)
            .bind(worker)
            .bind(token)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(jobs)
    }

    async fn finish_all(&self, done: &[(&Job, &Finish)]) -> Result<Vec<bool>, OutboxError> {
        let now = now_ms();
        let mut owned = Vec::with_capacity(done.len());
        // One write transaction for the whole batch.
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for (job, finish) in done {
            let status = finish.status.as_str();
            let updated = sqlx::query(
                "UPDATE oncely_outbox
                SET status = ?3, lease_token = NULL, last_error = ?7,
                    run_after = CASE WHEN ?3 = 'pending' THEN ?8 + ?4 ELSE run_after END,
                    sent_at = CASE WHEN ?3 = 'sent' THEN ?8 END,
                    dead_at = CASE WHEN ?3 = 'dead' THEN ?8 END,
                    provider_message_id = COALESCE(?6, provider_message_id)
              WHERE id = ?1 AND lease_token = ?2 AND status = 'pending'",
            )
            .bind(job.id)
            .bind(job.lease_token)
            .bind(status)
            .bind(ms(finish.retry_in))
            .bind(finish.result.as_str())
            .bind(finish.provider_message_id.as_deref())
            .bind(finish.error.as_deref())
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if updated == 1 {
                sqlx::query(
                    "UPDATE oncely_outbox_attempts
                    SET finished_at = ?3, result = ?4, provider_message_id = ?5, error = ?6
                  WHERE job_id = ?1 AND lease_token = ?2 AND finished_at IS NULL",
                )
                .bind(job.id)
                .bind(job.lease_token)
                .bind(now)
                .bind(finish.result.as_str())
                .bind(finish.provider_message_id.as_deref())
                .bind(finish.error.as_deref())
                .execute(&mut *tx)
                .await?;
            }
            owned.push(updated == 1);
        }
        tx.commit().await?;
        Ok(owned)
    }

    async fn release(&self, job: &Job) -> Result<bool, OutboxError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let updated = sqlx::query(
            "UPDATE oncely_outbox SET run_after = ?3, lease_token = NULL, attempts = attempts - 1
              WHERE id = ?1 AND lease_token = ?2 AND status = 'pending'",
        )
        .bind(job.id)
        .bind(job.lease_token)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if updated == 1 {
            sqlx::query("DELETE FROM oncely_outbox_attempts WHERE job_id = ?1 AND lease_token = ?2 AND finished_at IS NULL")
                .bind(job.id)
                .bind(job.lease_token)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        self.notify();
        Ok(updated == 1)
    }

    fn wake(&self) {
        self.notify();
    }

    async fn wakeup(&self) -> Result<Wakeup, OutboxError> {
        Ok(Wakeup::Signal(self.notify.clone()))
    }

    async fn job(&self, operation_key: &str) -> Result<Option<JobRecord>, OutboxError> {
        let sql = AssertSqlSafe(format!(
            "SELECT {RECORD_COLUMNS} FROM oncely_outbox WHERE operation_key = ?1"
        ));
        let row = sqlx::query(sql)
            .bind(operation_key)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(record_from).transpose()
    }

    async fn attempts(&self, job_id: i64) -> Result<Vec<AttemptRecord>, OutboxError> {
        let rows = sqlx::query(
            "SELECT attempt, worker, result, provider_message_id, error, finished_at IS NOT NULL AS finished
               FROM oncely_outbox_attempts WHERE job_id = ?1 ORDER BY id",
        )
        .bind(job_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(AttemptRecord {
                    attempt: row.try_get("attempt")?,
                    worker: row.try_get("worker")?,
                    result: row.try_get("result")?,
                    provider_message_id: row.try_get("provider_message_id")?,
                    error: row.try_get("error")?,
                    finished: row.try_get("finished")?,
                })
            })
            .collect()
    }

    async fn backlog(&self) -> Result<Backlog, OutboxError> {
        let row = sqlx::query(
            "SELECT count(*) AS pending, min(created_at) AS oldest FROM oncely_outbox WHERE status = 'pending'",
        )
        .fetch_one(&self.pool)
        .await?;
        let oldest: Option<i64> = row.try_get("oldest")?;
        let age = oldest.map_or(0.0, |t| (now_ms() - t).max(0) as f64 / 1000.0);
        Ok(Backlog {
            pending: row.try_get("pending")?,
            oldest_pending_seconds: age,
        })
    }

    async fn prune(&self, older_than: Duration, limit: u32) -> Result<u64, OutboxError> {
        // Index: oncely_outbox_finished.
        let done = sqlx::query(
            "DELETE FROM oncely_outbox WHERE id IN (
                 SELECT id FROM oncely_outbox
                  WHERE status <> 'pending' AND COALESCE(sent_at, dead_at) < ?1
                  ORDER BY COALESCE(sent_at, dead_at)
                  LIMIT ?2)",
        )
        .bind(now_ms() - ms(older_than))
        .bind(i64::from(limit))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn list(&self, filter: &JobFilter) -> Result<Vec<JobRecord>, OutboxError> {
        let sql = AssertSqlSafe(format!(
            "SELECT {RECORD_COLUMNS} FROM oncely_outbox
              WHERE (?1 IS NULL OR kind = ?1) AND (?2 IS NULL OR status = ?2)
              ORDER BY id DESC LIMIT ?3"
        ));
        let rows = sqlx::query(sql)
            .bind(filter.kind.as_deref())
            .bind(filter.status())
            .bind(filter.limit())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(record_from).collect()
    }

    async fn redrive(&self, operation_key: &str) -> Result<bool, OutboxError> {
        let done = sqlx::query(
            "UPDATE oncely_outbox
                SET status = 'pending', run_after = ?2, attempts = 0, dead_at = NULL,
                    lease_token = NULL, last_error = NULL
              WHERE operation_key = ?1 AND status = 'dead'",
        )
        .bind(operation_key)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        self.notify();
        Ok(done.rows_affected() == 1)
    }

    async fn pending(&self) -> Result<i64, OutboxError> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM oncely_outbox WHERE status = 'pending'")
                .fetch_one(&self.pool)
                .await?,
        )
    }
}
