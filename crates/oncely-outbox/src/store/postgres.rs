//! The outbox on PostgreSQL.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgListener, PgRow};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, Row};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::{Backlog, CHANNEL, Finish, JobFilter, JobStore, OutboxError, Wakeup};
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
                include_str!("../../migrations/postgres/0001_outbox.sql"),
            ),
            (
                2,
                "skipped attempts",
                include_str!("../../migrations/postgres/0002_skipped.sql"),
            ),
            (
                3,
                "prune index",
                include_str!("../../migrations/postgres/0003_prune_index.sql"),
            ),
            (
                4,
                "due index by kind",
                include_str!("../../migrations/postgres/0004_due_by_kind.sql"),
            ),
        ],
        MIGRATIONS_TABLE,
    )
}

/// Enqueues `job` on `conn` — inside the caller's transaction, so the job commits with the
/// business change, or not at all.
///
/// It does not NOTIFY: a `pg_notify` in the transaction would take PostgreSQL's global notify
/// lock at commit and serialise every committing enqueuer. After the transaction commits, call
/// [`PgJobStore::wake`] (or [`JobStore::wake`]): one background task sends at most one NOTIFY
/// per [`NOTIFY_INTERVAL`], on its own connection, for any number of wakes. Without a wake,
/// workers still find the job at their next poll.
///
/// Index: the unique index on `operation_key`.
pub async fn enqueue(conn: &mut PgConnection, job: &NewJob) -> Result<Enqueued, OutboxError> {
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO oncely_outbox (operation_key, kind, payload, delivery_key, not_after)
         VALUES ($1, $2, $3::text::jsonb, $4, $5)
         ON CONFLICT (operation_key) DO NOTHING
         RETURNING id",
    )
    .bind(&job.operation_key)
    .bind(&job.kind)
    .bind(job.payload.to_string())
    .bind(Uuid::new_v4())
    .bind(job.not_after)
    .fetch_optional(conn)
    .await?;
    Ok(id.map_or(Enqueued::AlreadyExists, Enqueued::Inserted))
}

/// At most one NOTIFY per this interval, however many commits wake the workers.
pub const NOTIFY_INTERVAL: Duration = Duration::from_millis(10);

/// A [`JobStore`] on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgJobStore {
    pool: PgPool,
    poll_only: bool,
    waker: Arc<Waker>,
}

/// The sender of wake-ups to the notifier task (started by the first wake). When the last
/// clone of the store goes, the task ends.
#[derive(Debug, Default)]
struct Waker(OnceLock<mpsc::Sender<()>>);

impl PgJobStore {
    /// A store on `pool`; idle workers LISTEN for new jobs.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            poll_only: false,
            waker: Arc::default(),
        }
    }

    /// Workers only poll: for connection poolers in transaction mode, where LISTEN does not work.
    pub fn poll_only(mut self) -> Self {
        self.poll_only = true;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Wakes idle workers in every process: call it after a transaction that enqueued
    /// committed. Never blocks: wakes arriving together become one NOTIFY (at most one per
    /// [`NOTIFY_INTERVAL`]), sent by a background task on a connection of its own. Outside a
    /// Tokio runtime it does nothing (workers poll).
    pub fn wake(&self) {
        let sender = self.waker.0.get_or_init(|| {
            let (sender, receiver) = mpsc::channel(1);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(notifier(self.pool.clone(), receiver));
            }
            sender
        });
        // Full: a NOTIFY is already due, and it covers this commit too.
        let _ = sender.try_send(());
    }
}

/// Sends one NOTIFY per batch of wakes, then rests [`NOTIFY_INTERVAL`] (wakes meanwhile wait,
/// coalesced, for the next one).
async fn notifier(pool: PgPool, mut wakes: mpsc::Receiver<()>) {
    let mut conn: Option<PgConnection> = None;
    while wakes.recv().await.is_some() {
        if conn.is_none() {
            match PgConnection::connect_with(&pool.connect_options()).await {
                Ok(c) => conn = Some(c),
                Err(error) => {
                    tracing::warn!(%error, "outbox notifier cannot connect; workers poll")
                }
            }
        }
        if let Some(c) = conn.as_mut()
            && let Err(error) = sqlx::query("SELECT pg_notify($1, '')")
                .bind(CHANNEL)
                .execute(&mut *c)
                .await
        {
            tracing::warn!(%error, "outbox NOTIFY failed; workers poll until it works again");
            conn = None;
        }
        tokio::time::sleep(NOTIFY_INTERVAL).await;
    }
}

// Index: oncely_outbox_due_by_kind (partial, pending only), walked once per kind, oldest due
// first; at most `limit` rows per kind are locked and the oldest `limit` of them claimed (the
// rest unlock when the statement commits). SKIP LOCKED: workers never wait for each other. Claiming pushes run_after to the lease's end, so a dead worker's job is due again then.
const CLAIM: &str = "
    WITH due AS (
        SELECT d.id FROM unnest($4::text[]) AS k(kind)
        CROSS JOIN LATERAL (
            SELECT id, run_after FROM oncely_outbox
             WHERE status = 'pending' AND kind = k.kind AND run_after <= now()
             ORDER BY run_after, id
             LIMIT $1
               FOR UPDATE SKIP LOCKED
        ) d
        ORDER BY d.run_after, d.id
        LIMIT $1
    ), claimed AS (
        UPDATE oncely_outbox o
           SET run_after = now() + make_interval(secs => $2), lease_token = $3,
               attempts = o.attempts + 1
          FROM due WHERE o.id = due.id
        RETURNING o.id, o.operation_key, o.kind, o.payload::text AS payload, o.delivery_key,
                  o.attempts, o.created_at, o.not_after
    ), abandoned AS (
        UPDATE oncely_outbox_attempts SET finished_at = now(), result = 'abandoned',
               error = 'the worker''s lease ended before the attempt finished'
         WHERE job_id IN (SELECT id FROM claimed) AND finished_at IS NULL
    ), opened AS (
        INSERT INTO oncely_outbox_attempts (job_id, attempt, worker, lease_token)
        SELECT id, attempts, $5, $3 FROM claimed
    )
    SELECT * FROM claimed ORDER BY id";

// One statement for a whole batch of results: the jobs (by primary key, guarded by the lease
// token) and their open attempt rows (oncely_outbox_attempts_job).
const FINISH: &str = "
    WITH done AS (
        SELECT * FROM unnest($1::int8[], $2::uuid[], $3::text[], $4::float8[], $5::text[],
                             $6::text[], $7::text[])
                   AS d(id, lease_token, status, retry_secs, result, provider_message_id, error)
    ), job AS (
        UPDATE oncely_outbox o
           SET status = d.status, lease_token = NULL, last_error = d.error,
               run_after = CASE WHEN d.status = 'pending'
                                THEN now() + make_interval(secs => d.retry_secs) ELSE o.run_after END,
               sent_at = CASE WHEN d.status = 'sent' THEN now() END,
               dead_at = CASE WHEN d.status = 'dead' THEN now() END,
               provider_message_id = COALESCE(d.provider_message_id, o.provider_message_id)
          FROM done d
         WHERE o.id = d.id AND o.lease_token = d.lease_token AND o.status = 'pending'
        RETURNING o.id, d.lease_token, d.result, d.provider_message_id, d.error
    ), attempt AS (
        UPDATE oncely_outbox_attempts a
           SET finished_at = now(), result = j.result, provider_message_id = j.provider_message_id,
               error = j.error
          FROM job j
         WHERE a.job_id = j.id AND a.lease_token = j.lease_token AND a.finished_at IS NULL
    )
    SELECT id FROM job";

const RELEASE: &str = "
    WITH job AS (
        UPDATE oncely_outbox SET run_after = now(), lease_token = NULL, attempts = attempts - 1
         WHERE id = $1 AND lease_token = $2 AND status = 'pending'
        RETURNING id
    ), attempt AS (
        DELETE FROM oncely_outbox_attempts
         WHERE job_id IN (SELECT id FROM job) AND lease_token = $2 AND finished_at IS NULL
    )
    SELECT count(*) FROM job";

fn job_from(row: &PgRow, lease_token: Uuid) -> Result<Job, OutboxError> {
    Ok(Job {
        id: row.try_get("id")?,
        operation_key: row.try_get("operation_key")?,
        kind: row.try_get("kind")?,
        payload: serde_json::from_str(row.try_get("payload")?)?,
        delivery_key: row.try_get("delivery_key")?,
        attempt: row.try_get("attempts")?,
        created_at: row.try_get("created_at")?,
        not_after: row.try_get("not_after")?,
        lease_token,
    })
}

const RECORD_COLUMNS: &str = "id, operation_key, kind, status, attempts, last_error, provider_message_id, payload::text AS payload, delivery_key";

fn record_from(row: &sqlx::postgres::PgRow) -> Result<JobRecord, OutboxError> {
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

impl JobStore for PgJobStore {
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
        let rows = sqlx::query(CLAIM)
            .bind(i64::from(limit))
            .bind(lease.as_secs_f64())
            .bind(token)
            .bind(kinds)
            .bind(worker)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|row| job_from(row, token)).collect()
    }

    async fn finish_all(&self, done: &[(&Job, &Finish)]) -> Result<Vec<bool>, OutboxError> {
        let column = |f: &dyn Fn(&Job, &Finish) -> Option<String>| -> Vec<Option<String>> {
            done.iter().map(|(job, finish)| f(job, finish)).collect()
        };
        let ids: Vec<i64> = done.iter().map(|(job, _)| job.id).collect();
        let finished: Vec<i64> = sqlx::query_scalar(FINISH)
            .bind(&ids)
            .bind(
                done.iter()
                    .map(|(job, _)| job.lease_token)
                    .collect::<Vec<_>>(),
            )
            .bind(column(&|_, f| Some(f.status.as_str().to_owned())))
            .bind(
                done.iter()
                    .map(|(_, f)| f.retry_in.as_secs_f64())
                    .collect::<Vec<_>>(),
            )
            .bind(column(&|_, f| Some(f.result.as_str().to_owned())))
            .bind(column(&|_, f| f.provider_message_id.clone()))
            .bind(column(&|_, f| f.error.clone()))
            .fetch_all(&self.pool)
            .await?;
        Ok(ids.iter().map(|id| finished.contains(id)).collect())
    }

    async fn release(&self, job: &Job) -> Result<bool, OutboxError> {
        let n: i64 = sqlx::query_scalar(RELEASE)
            .bind(job.id)
            .bind(job.lease_token)
            .fetch_one(&self.pool)
            .await?;
        Ok(n == 1)
    }

    fn wake(&self) {
        PgJobStore::wake(self);
    }

    async fn wakeup(&self) -> Result<Wakeup, OutboxError> {
        if self.poll_only {
            return Ok(Wakeup::Poll);
        }
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        Ok(Wakeup::Listen(Box::new(listener)))
    }

    async fn job(&self, operation_key: &str) -> Result<Option<JobRecord>, OutboxError> {
        let sql = AssertSqlSafe(format!(
            "SELECT {RECORD_COLUMNS} FROM oncely_outbox WHERE operation_key = $1"
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
               FROM oncely_outbox_attempts WHERE job_id = $1 ORDER BY id",
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
            "SELECT count(*) AS pending,
                    COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0) AS oldest
               FROM oncely_outbox WHERE status = 'pending'",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Backlog {
            pending: row.try_get("pending")?,
            oldest_pending_seconds: row.try_get("oldest")?,
        })
    }

    async fn prune(&self, older_than: Duration, limit: u32) -> Result<u64, OutboxError> {
        // Index: oncely_outbox_finished. SKIP LOCKED: never waits for a worker.
        let done = sqlx::query(
            "DELETE FROM oncely_outbox WHERE id = ANY (ARRAY(
                 SELECT id FROM oncely_outbox
                  WHERE status <> 'pending'
                    AND COALESCE(sent_at, dead_at) < now() - make_interval(secs => $1)
                  ORDER BY COALESCE(sent_at, dead_at)
                  LIMIT $2
                    FOR UPDATE SKIP LOCKED))",
        )
        .bind(older_than.as_secs_f64())
        .bind(i64::from(limit))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn list(&self, filter: &JobFilter) -> Result<Vec<JobRecord>, OutboxError> {
        let sql = AssertSqlSafe(format!(
            "SELECT {RECORD_COLUMNS} FROM oncely_outbox
              WHERE ($1 IS NULL OR kind = $1) AND ($2 IS NULL OR status = $2)
              ORDER BY id DESC LIMIT $3"
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
                SET status = 'pending', run_after = now(), attempts = 0, dead_at = NULL,
                    lease_token = NULL, last_error = NULL
              WHERE operation_key = $1 AND status = 'dead'",
        )
        .bind(operation_key)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 1 {
            self.wake();
        }
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
