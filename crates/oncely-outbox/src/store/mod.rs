//! Where jobs live: one trait, a PostgreSQL and a SQLite implementation, one conformance suite
//! (`tests/it/store_conformance.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::Notify;

use crate::job::{AttemptRecord, AttemptResult, Job, JobRecord, JobStatus};

pub mod postgres;
pub mod sqlite;

/// A migrator of `(version, description, sql)` steps with its own history table, so that the
/// outbox's migrations never mix with the application's.
pub(crate) fn migrator_of(
    steps: &[(i64, &'static str, &'static str)],
    table: &'static str,
) -> sqlx::migrate::Migrator {
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
    migrator.dangerous_set_table_name(table);
    // Migrations only add: a process of the previous release must still start (and restart)
    // on a database a newer release already migrated, so versions it does not know are fine.
    migrator.set_ignore_missing(true);
    migrator
}

/// The PostgreSQL channel [`postgres::PgJobStore::wake`] notifies and idle workers listen on.
pub const CHANNEL: &str = "oncely_outbox";

/// An outbox failure.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The database refused or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The schema could not be migrated.
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored payload is not valid JSON.
    #[error("stored payload is not JSON: {0}")]
    Payload(#[from] serde_json::Error),
}

/// How an attempt ends, as the store writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    /// The job's new status.
    pub status: JobStatus,
    /// The attempt's result.
    pub result: AttemptResult,
    /// For a retry: when the job is due again.
    pub retry_in: Duration,
    /// The provider's id of a delivery.
    pub provider_message_id: Option<String>,
    /// What went wrong (or why it is dead).
    pub error: Option<String>,
}

impl Finish {
    /// The effect happened: the job is sent.
    pub fn sent(provider_message_id: Option<String>) -> Self {
        Self {
            status: JobStatus::Sent,
            result: AttemptResult::Sent,
            retry_in: Duration::ZERO,
            provider_message_id,
            error: None,
        }
    }

    /// The job is dead after an attempt that ended `result`, for `error`.
    pub fn dead(result: AttemptResult, error: String) -> Self {
        Self {
            status: JobStatus::Dead,
            result,
            retry_in: Duration::ZERO,
            provider_message_id: None,
            error: Some(error),
        }
    }

    /// The job stays pending and is due again in `retry_in`.
    pub fn retry(result: AttemptResult, retry_in: Duration, error: String) -> Self {
        Self {
            status: JobStatus::Pending,
            result,
            retry_in,
            provider_message_id: None,
            error: Some(error),
        }
    }
}

/// How an idle worker learns of new jobs.
pub enum Wakeup {
    /// Only by polling.
    Poll,
    /// PostgreSQL LISTEN (woken by [`JobStore::wake`] after commits); polling stays as the
    /// fallback.
    Listen(Box<PgListener>),
    /// An in-process signal (SQLite: [`sqlite::SqliteJobStore::notify`]).
    Signal(Arc<Notify>),
}

impl Wakeup {
    /// Waits for a wake-up, at most `max` (the polling interval).
    pub async fn wait(&mut self, max: Duration) {
        match self {
            Self::Poll => tokio::time::sleep(max).await,
            Self::Listen(listener) => {
                match tokio::time::timeout(max, listener.recv()).await {
                    Ok(Ok(_)) | Err(_) => {}
                    // The listener reconnects by itself; meanwhile, behave like polling.
                    Ok(Err(error)) => {
                        tracing::warn!(%error, "outbox LISTEN failed; polling");
                        tokio::time::sleep(max).await;
                    }
                }
            }
            Self::Signal(notify) => {
                let _ = tokio::time::timeout(max, notify.notified()).await;
            }
        }
    }
}

/// Where jobs live.
pub trait JobStore: Clone + Send + Sync + 'static {
    /// Creates or updates the outbox tables (its own migration history table).
    fn migrate(&self) -> impl Future<Output = Result<(), OutboxError>> + Send;

    /// Claims up to `limit` due jobs of `kinds` for `worker` under a lease of `lease`, and opens
    /// an attempt row for each. A job whose earlier attempt never finished (its worker died) has
    /// that attempt closed as `abandoned`.
    fn claim(
        &self,
        worker: &str,
        kinds: &[String],
        limit: u32,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Job>, OutboxError>> + Send;

    /// Ends the attempts of claimed jobs, all in one statement where the database allows. For
    /// each, `false` if its claim's lease token no longer owns the job (its lease expired and
    /// another worker took it).
    fn finish_all(
        &self,
        done: &[(&Job, &Finish)],
    ) -> impl Future<Output = Result<Vec<bool>, OutboxError>> + Send;

    /// Ends the attempt of one claimed job; see [`JobStore::finish_all`].
    fn finish(
        &self,
        job: &Job,
        finish: &Finish,
    ) -> impl Future<Output = Result<bool, OutboxError>> + Send {
        async move { Ok(self.finish_all(&[(job, finish)]).await?[0]) }
    }

    /// Hands a claimed job back unstarted (shutdown): due now, the attempt not counted.
    fn release(&self, job: &Job) -> impl Future<Output = Result<bool, OutboxError>> + Send;

    /// Wakes idle workers after a transaction that enqueued has committed (call it after the
    /// commit, never inside the transaction). PostgreSQL: a coalesced NOTIFY from a background
    /// task, reaching workers in every process; SQLite: this process's workers. Without it,
    /// workers find new jobs at their next poll ([`crate::WorkerConfig::poll_interval`]).
    fn wake(&self);

    /// How this store wakes idle workers.
    fn wakeup(&self) -> impl Future<Output = Result<Wakeup, OutboxError>> + Send;

    /// A job by its operation key.
    fn job(
        &self,
        operation_key: &str,
    ) -> impl Future<Output = Result<Option<JobRecord>, OutboxError>> + Send;

    /// The attempts of a job, in order.
    fn attempts(
        &self,
        job_id: i64,
    ) -> impl Future<Output = Result<Vec<AttemptRecord>, OutboxError>> + Send;

    /// How many jobs are pending.
    fn pending(&self) -> impl Future<Output = Result<i64, OutboxError>> + Send;

    /// Deletes up to `limit` sent or dead jobs (and their attempts) that finished more than
    /// `older_than` ago; returns how many. Call it repeatedly: each batch is short and skips rows
    /// others hold. Until a job is pruned its operation key cannot be enqueued again.
    fn prune(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> impl Future<Output = Result<u64, OutboxError>> + Send;

    /// How many jobs are pending and how long the oldest has waited (for metrics).
    fn backlog(&self) -> impl Future<Output = Result<Backlog, OutboxError>> + Send;

    /// Jobs for operators, newest first. (No index serves the kind filter: this is an
    /// inspection tool, not a hot path.)
    fn list(
        &self,
        filter: &JobFilter,
    ) -> impl Future<Output = Result<Vec<JobRecord>, OutboxError>> + Send;

    /// Re-drives a dead job: pending and due now, with a fresh attempt budget and the *same*
    /// delivery key (a provider that saw an earlier attempt still deduplicates). Its attempt
    /// history is kept. `false` if no dead job has this key.
    fn redrive(
        &self,
        operation_key: &str,
    ) -> impl Future<Output = Result<bool, OutboxError>> + Send;
}

/// The outbox's backlog.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Backlog {
    /// Pending jobs (due or waiting for a retry).
    pub pending: i64,
    /// Seconds since the oldest pending job was enqueued (0 when none).
    pub oldest_pending_seconds: f64,
}

/// Which jobs [`JobStore::list`] returns.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    /// Only this kind.
    pub kind: Option<String>,
    /// Only this status.
    pub status: Option<JobStatus>,
    /// At most this many (0: 50).
    pub limit: u32,
}

impl JobFilter {
    pub(crate) fn limit(&self) -> i64 {
        if self.limit == 0 {
            50
        } else {
            i64::from(self.limit)
        }
    }

    pub(crate) fn status(&self) -> Option<&'static str> {
        self.status.map(JobStatus::as_str)
    }
}
