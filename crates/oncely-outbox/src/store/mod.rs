//! Where jobs live: the [`JobStore`] trait, and its one implementation, [`SqlJobStore`],
//! written once over a [`Dialect`] — PostgreSQL ([`postgres::PgJobStore`], feature `postgres`)
//! or SQLite ([`sqlite::SqliteJobStore`], feature `sqlite`). Each dialect brings its statements
//! (`sql/postgres.rs`, `sql/sqlite.rs`, under the same names), how it stores a moment, and how
//! it wakes idle workers. One conformance suite runs on both (`tests/it/store_conformance.rs`).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use time::OffsetDateTime;

use crate::job::{
    AttemptRecord, AttemptResult, Ended, Enqueued, Job, JobRecord, JobStatus, NewJob,
};

mod clock;
mod dialect;
mod rows;
mod sql;
mod wakeups;

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use clock::Clock;
pub use dialect::{Dialect, SqlJobStore};
pub use wakeups::Wakeup;

/// The table that records which of the outbox's migrations ran (its own, so that they never
/// mix with the application's).
pub const MIGRATIONS_TABLE: &str = "_oncely_outbox_migrations";

/// The PostgreSQL channel enqueues and [`JobStore::wake`] notify and idle workers listen on.
#[cfg(feature = "postgres")]
pub const CHANNEL: &str = "oncely_outbox";

/// An outbox failure.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The database refused or could not be reached.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// The schema could not be migrated.
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A payload is not valid JSON.
    #[error("payload is not JSON: {0}")]
    Payload(#[from] serde_json::Error),
}

impl From<sqlx::Error> for OutboxError {
    /// Also tells [`oncely_sql::notice`] (a read-only answer: the connections to that server are
    /// discarded; a lost server: the primary is looked for again).
    fn from(error: sqlx::Error) -> Self {
        oncely_sql::notice(&error);
        OutboxError::Database(error)
    }
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
    /// The attempt spent none of the attempt budget (throttled, paused): the store counts it in
    /// the job's `free_attempts`.
    pub free_attempt: bool,
    /// Forget the job's frozen payload ([`Job::frozen`](crate::Job::frozen)): this attempt froze
    /// it and the provider surely stored nothing under the key (it throttled or refused the
    /// request), so the next attempt freezes what current state says — a sender fixed after a
    /// refusal reaches the job.
    pub thaw: bool,
    /// Jobs to enqueue with this finish, in the same write, if the finish still owns the job
    /// (its lease token): [`Handler::then`](crate::Handler::then)'s answer for a final status.
    /// A follow-up whose operation key exists is not added (a re-recorded finish never doubles
    /// them). Empty for every other attempt.
    pub follow_ups: Vec<NewJob>,
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
            free_attempt: false,
            thaw: false,
            follow_ups: Vec::new(),
        }
    }

    /// The job is skipped: its handler chose not to run it, for `reason` ([`Delivery::Skipped`](crate::Delivery::Skipped)).
    pub fn skipped(reason: String) -> Self {
        Self {
            status: JobStatus::Skipped,
            result: AttemptResult::Skipped,
            retry_in: Duration::ZERO,
            provider_message_id: None,
            error: Some(reason),
            free_attempt: false,
            thaw: false,
            follow_ups: Vec::new(),
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
            free_attempt: false,
            thaw: false,
            follow_ups: Vec::new(),
        }
    }

    /// The job stays pending and is due again in `retry_in`; the attempt spent one of its
    /// budget.
    pub fn retry(result: AttemptResult, retry_in: Duration, error: String) -> Self {
        Self {
            status: JobStatus::Pending,
            result,
            retry_in,
            provider_message_id: None,
            error: Some(error),
            free_attempt: false,
            thaw: false,
            follow_ups: Vec::new(),
        }
    }

    /// How the job ended, if this finish gives it a final status (sent, dead, skipped).
    pub fn ended(&self) -> Option<Ended> {
        let reason = || self.error.clone().unwrap_or_default();
        match self.status {
            JobStatus::Pending | JobStatus::Unknown => None,
            JobStatus::Sent => Some(Ended::Sent {
                provider_message_id: self.provider_message_id.clone(),
            }),
            JobStatus::Dead => Some(Ended::Dead {
                result: self.result,
                reason: reason(),
            }),
            JobStatus::Skipped => Some(Ended::Skipped { reason: reason() }),
        }
    }

    /// This finish, parked instead ([`JobStatus::Unknown`]): the attempt's outcome is unknown
    /// and the kind reconciles ([`OnUnknown::Reconcile`](crate::OnUnknown)). It keeps its
    /// result, provider message id and budget accounting; a reconciler looks at it again after
    /// `retry_in`; follow-ups wait for its settlement.
    pub fn parked(self) -> Self {
        let error = match self.error {
            Some(error) => {
                format!("{error}; parked until settled: the provider may have accepted it")
            }
            None => "parked until settled: the provider may have accepted it".to_owned(),
        };
        Self {
            status: JobStatus::Unknown,
            error: Some(error),
            follow_ups: Vec::new(),
            ..self
        }
    }

    /// The job stays pending and is due again in `retry_in`; the attempt spent nothing of its
    /// budget (throttled, paused).
    pub fn retry_free(result: AttemptResult, retry_in: Duration, error: String) -> Self {
        Self {
            free_attempt: true,
            ..Self::retry(result, retry_in, error)
        }
    }
}

/// Where jobs live.
pub trait JobStore: Clone + Send + Sync + 'static {
    /// The database whose transactions [`JobStore::enqueue`] joins.
    type Database: sqlx::Database;

    /// Creates or updates the outbox tables (its own migration history table).
    fn migrate(&self) -> impl Future<Output = Result<(), OutboxError>> + Send;

    /// Enqueues `job` on `conn` — inside the caller's transaction, so the job commits with the
    /// business change, or not at all — and sees to it that idle workers learn of the job once
    /// it commits, with no call after the commit: on SQLite this process's workers are signalled
    /// at once (their claim waits for this transaction's write lock); on PostgreSQL a NOTIFY
    /// reaches workers in every process at commit (see [`postgres::PgJobStore`] for how it is
    /// rate-limited). A job whose operation key exists is not added ([`Enqueued::AlreadyExists`]).
    fn enqueue(
        &self,
        conn: &mut <Self::Database as sqlx::Database>::Connection,
        job: &NewJob,
    ) -> impl Future<Output = Result<Enqueued, OutboxError>> + Send;

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

    /// Claims up to `limit` due jobs of `kind`, as [`JobStore::claim`] does, taking at most
    /// `per_partition` minus `running[p]` jobs of each partition `p` ([`NewJob::partition`]):
    /// `running` says how many jobs of each partition the worker runs now (absent: none). A
    /// partition at its limit is skipped, never scanned job by job, so its backlog does not keep
    /// the kind's other partitions waiting. Jobs without a partition are limited by `limit`
    /// only. The oldest due jobs first, over every partition.
    fn claim_partitioned(
        &self,
        worker: &str,
        kind: &str,
        limit: u32,
        per_partition: u32,
        running: &HashMap<String, u32>,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Job>, OutboxError>> + Send;

    /// Claims as [`JobStore::claim`] does; the attempt it opens for a job whose kind is in
    /// `marking` is ready to record its point of no return ([`crate::PointOfNoReturn`],
    /// [`JobStore::pass_point_of_no_return`]): its row says `ahead` until its worker records
    /// the moment, so that if the worker dies first, the next claim knows that nothing was
    /// handed over. Other attempts' mark is unknown. The worker names in `marking` only the
    /// kinds whose handler records the moment ([`crate::Handler::marks_point_of_no_return`])
    /// and which reconcile. The default ignores `marking` (every mark unknown: the safe
    /// answer).
    fn claim_marking(
        &self,
        worker: &str,
        kinds: &[String],
        limit: u32,
        lease: Duration,
        marking: &[String],
    ) -> impl Future<Output = Result<Vec<Job>, OutboxError>> + Send {
        let _ = marking;
        self.claim(worker, kinds, limit, lease)
    }

    /// Claims as [`JobStore::claim_partitioned`] does, with the attempts of the kind ready to
    /// record their point of no return if `marking` (see [`JobStore::claim_marking`]).
    #[allow(clippy::too_many_arguments)]
    fn claim_partitioned_marking(
        &self,
        worker: &str,
        kind: &str,
        limit: u32,
        per_partition: u32,
        running: &HashMap<String, u32>,
        lease: Duration,
        marking: bool,
    ) -> impl Future<Output = Result<Vec<Job>, OutboxError>> + Send {
        let _ = marking;
        self.claim_partitioned(worker, kind, limit, per_partition, running, lease)
    }

    /// Records that a claimed job's attempt reached its point of no return
    /// ([`crate::PointOfNoReturn`]): its message is about to be handed over. One write, fenced
    /// by the claim's lease token, before anything of the message leaves. `false` if the claim
    /// no longer owns the job (its lease ended and another worker took it): then nothing may
    /// be handed over. The default records nothing and says `true`: a store that does not arm
    /// attempts ([`JobStore::claim_marking`]) leaves every mark unknown, which parks an
    /// abandoned attempt as if it had passed.
    fn pass_point_of_no_return(
        &self,
        job: &Job,
    ) -> impl Future<Output = Result<bool, OutboxError>> + Send {
        let _ = job;
        std::future::ready(Ok(true))
    }

    /// Ends the attempts of claimed jobs, all in one write, with their follow-up jobs
    /// ([`Finish::follow_ups`]: inserted only for the jobs this write finishes, each unless its
    /// operation key exists; their kinds' idle workers are woken as by [`JobStore::enqueue`]).
    /// For each, `false` if its claim's lease token no longer owns the job (its lease expired
    /// and another worker took it): nothing of it is written, its follow-ups neither.
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

    /// Stores `frozen` as what a claimed job's attempts send ([`crate::Handler::freeze`],
    /// [`Job::frozen`]) — once: a job that holds a frozen value keeps it (the first writer
    /// wins), and only while `job`'s claim owns it (its lease token). Returns the value the job
    /// holds now (`frozen`, or what an earlier attempt stored), or `None` if the claim no longer
    /// owns the job: then nothing may be sent under it.
    fn freeze(
        &self,
        job: &Job,
        frozen: &serde_json::Value,
    ) -> impl Future<Output = Result<Option<serde_json::Value>, OutboxError>> + Send;

    /// Hands a claimed job back unstarted: due now, the attempt not counted.
    fn release(&self, job: &Job) -> impl Future<Output = Result<bool, OutboxError>> + Send;

    /// Wakes idle workers of every kind for jobs that came by other means than
    /// [`JobStore::enqueue`] (an `INSERT` of your own, a re-drive): call it after they
    /// committed. PostgreSQL: a coalesced NOTIFY from a background task, reaching workers in
    /// every process; SQLite: this process's workers. Without it, workers find such jobs at
    /// their next poll ([`crate::WorkerConfig::poll_interval`]).
    fn wake(&self);

    /// A wake-up for an idle worker of `kinds`: it is woken for jobs of those kinds only, and
    /// the wake-ups that arrive while it is busy collapse into one. Every worker of a store (and
    /// of its clones) shares one source: on SQLite the store's enqueues, on PostgreSQL one
    /// listener per store on a connection of its own (never one of the pool's), started by the
    /// first worker that asks and read continuously whatever the workers do. If the listener
    /// cannot connect or breaks, it logs, reconnects with backoff, and the workers poll
    /// meanwhile ([`crate::WorkerConfig::poll_interval`]).
    fn wakeup(&self, kinds: &[String]) -> Wakeup;

    /// The store's time ([`Clock`]): what the worker compares deadlines and the retry horizon
    /// with.
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    /// A job by its operation key.
    fn job(
        &self,
        operation_key: &str,
    ) -> impl Future<Output = Result<Option<JobRecord>, OutboxError>> + Send;

    /// A job by its id (what [`JobStore::list`] shows as [`JobRecord::id`]).
    fn job_by_id(
        &self,
        id: i64,
    ) -> impl Future<Output = Result<Option<JobRecord>, OutboxError>> + Send;

    /// The attempts of a job, in order: over its whole life, every re-drive included (each
    /// re-drive numbers its attempts from 1 again: [`AttemptRecord::attempt`]).
    fn attempts(
        &self,
        job_id: i64,
    ) -> impl Future<Output = Result<Vec<AttemptRecord>, OutboxError>> + Send;

    /// How many jobs are pending.
    fn pending(&self) -> impl Future<Output = Result<i64, OutboxError>> + Send;

    /// Deletes up to `limit` sent, dead or skipped jobs (and their attempts) that finished more than
    /// `older_than` ago; returns how many. Call it repeatedly: each batch is short and skips rows
    /// others hold. Until a job is pruned its operation key cannot be enqueued again.
    fn prune(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> impl Future<Output = Result<u64, OutboxError>> + Send;

    /// The most recently skipped jobs ([`JobStatus::Skipped`]), newest first, at most `limit`:
    /// an inspection tool (the dev inbox shows them), not a hot path.
    fn skipped(
        &self,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<SkippedJob>, OutboxError>> + Send;

    /// How many jobs are pending and how long the oldest has waited (for metrics).
    fn backlog(&self) -> impl Future<Output = Result<Backlog, OutboxError>> + Send;

    /// Jobs for operators, newest first. (No index serves the kind filter: this is an
    /// inspection tool, not a hot path.)
    fn list(
        &self,
        filter: &JobFilter,
    ) -> impl Future<Output = Result<Vec<JobRecord>, OutboxError>> + Send;

    /// Re-drives a dead job: pending and due now, with a fresh attempt budget, a fresh retry
    /// horizon (counted from now: [`Job::horizon_from`]; its `created_at` is kept) and the
    /// *same* delivery key and frozen payload ([`Job::frozen`]: another payload under the same
    /// key would be refused). Its attempt history is kept. `false` if no dead job has this key.
    ///
    /// The same key deduplicates only inside the provider's window (about 24 h for common email
    /// APIs, from the key's first use): a job whose earlier attempt had an unknown outcome
    /// (`unknown`, `abandoned`) may have been delivered, and re-driving it after that window
    /// may deliver a second copy. [`JobStore::dead_jobs`] counts such jobs.
    fn redrive(
        &self,
        operation_key: &str,
    ) -> impl Future<Output = Result<bool, OutboxError>> + Send;

    /// Settles a parked job ([`JobStatus::Unknown`]) by its id, as `settlement` says, and wakes
    /// idle workers. `false` if no parked job has this id (it was settled already, or never
    /// parked). A job parks when its kind reconciles unknown outcomes
    /// ([`OnUnknown::Reconcile`](crate::OnUnknown)); what settles it is whoever can tell whether
    /// the provider accepted it: a reconciler that asks the provider, or an operator.
    fn settle(
        &self,
        id: i64,
        settlement: Settlement,
    ) -> impl Future<Output = Result<bool, OutboxError>> + Send;

    /// Takes up to `limit` parked jobs of `kinds` that are due for a look (their `run_after`
    /// passed; the oldest first) for a reconciler to ask their provider about, under a look
    /// lease of `look`: their `run_after` is pushed to its end (a reconciler that dies leaves
    /// them to the next look then) and a fresh lease token marks the look. They stay parked:
    /// only [`JobStore::settle_looked`] or [`JobStore::look_later`] under that token, or an
    /// operator's [`JobStore::settle`], changes them. Concurrent looks take other jobs
    /// (PostgreSQL: `FOR UPDATE SKIP LOCKED`).
    fn claim_parked(
        &self,
        kinds: &[String],
        limit: u32,
        look: Duration,
    ) -> impl Future<Output = Result<Vec<ParkedJob>, OutboxError>> + Send;

    /// Settles a job a look took ([`JobStore::claim_parked`]) as [`JobStore::settle`] does,
    /// recording the provider's message id (if it gave one) — only while the look still holds
    /// it (its lease token), it is still parked (an operator's settlement meanwhile, or a later
    /// look, wins) and, with `parked_at_least`, it has been parked that long by the store's
    /// clock (the one that wrote `parked_at`). `false` if one of those did not hold.
    fn settle_looked(
        &self,
        parked: &ParkedJob,
        settlement: Settlement,
        provider_message_id: Option<&str>,
        parked_at_least: Option<Duration>,
    ) -> impl Future<Output = Result<bool, OutboxError>> + Send;

    /// Leaves a job a look took parked, due for its next look in `after`, releasing the look
    /// (guarded as [`JobStore::settle_looked`]). `false` if the look no longer held it.
    fn look_later(
        &self,
        parked: &ParkedJob,
        after: Duration,
    ) -> impl Future<Output = Result<bool, OutboxError>> + Send;

    /// The dead jobs `filter` matches (an inspection tool, not a hot path): how many, a sample
    /// of up to `sample` of them (most recently dead first) and how many of them had an attempt
    /// with an unknown outcome (`unknown` or `abandoned`) that ended more than `window` ago —
    /// past the provider's deduplication window, a re-drive of those may deliver a second copy.
    fn dead_jobs(
        &self,
        filter: &DeadFilter,
        sample: u32,
        window: Duration,
    ) -> impl Future<Output = Result<DeadJobs, OutboxError>> + Send;

    /// Re-drives every dead job `filter` matches, as [`JobStore::redrive`] does one (each
    /// keeps its delivery key and frozen payload), and wakes idle workers.
    ///
    /// With `expect`, only if exactly that many match: otherwise nothing changes and the answer
    /// is [`BulkRedrive::CountDiffers`]. The count and the re-drive are one transaction that no
    /// concurrent change can slip into: on PostgreSQL the matching rows are locked
    /// (`FOR UPDATE`) and re-driven by id, so a job that dies meanwhile is neither counted nor
    /// re-driven; on SQLite the transaction holds the write lock from its start
    /// (`BEGIN IMMEDIATE`).
    fn redrive_dead(
        &self,
        filter: &DeadFilter,
        expect: Option<u64>,
    ) -> impl Future<Output = Result<BulkRedrive, OutboxError>> + Send;
}

/// A skipped job, as [`JobStore::skipped`] lists it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SkippedJob {
    /// Its operation key.
    pub operation_key: String,
    /// Its kind.
    pub kind: String,
    /// Why it was skipped (its handler's [`Delivery::Skipped`](crate::Delivery::Skipped)
    /// reason).
    pub reason: Option<String>,
    /// Its payload.
    pub payload: serde_json::Value,
    /// When it was skipped.
    #[serde(with = "time::serde::rfc3339")]
    pub skipped_at: OffsetDateTime,
}

/// What [`JobStore::redrive_dead`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkRedrive {
    /// It re-drove this many dead jobs: every one the filter matched.
    Redriven(u64),
    /// It changed nothing: the caller expected another number of matching jobs than the
    /// `matching` it found.
    CountDiffers {
        /// How many dead jobs matched.
        matching: u64,
    },
}

/// Which dead jobs [`JobStore::dead_jobs`] and [`JobStore::redrive_dead`] take: every filter
/// given must match (none: every dead job).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadFilter {
    /// Only this kind.
    pub kind: Option<String>,
    /// Only jobs that died at or after this moment.
    pub since: Option<OffsetDateTime>,
    /// Only jobs that died at or before this moment (a dry run's [`DeadJobs::as_of`]: jobs that
    /// die after it are left out).
    pub until: Option<OffsetDateTime>,
    /// Only jobs whose last error contains this text, ignoring case (a plain substring: `%`
    /// and `_` are no wildcards; on SQLite only ASCII letters fold case).
    pub reason_contains: Option<String>,
}

/// What [`JobStore::dead_jobs`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadJobs {
    /// The moment it counted at, by the store's time (on PostgreSQL the database's clock): a
    /// job that dies later is not among `matching`, so `until: Some(as_of)` leaves it out of a
    /// later count or re-drive too.
    pub as_of: OffsetDateTime,
    /// How many dead jobs match.
    pub matching: i64,
    /// How many of them had an attempt with an unknown outcome that ended longer ago than the
    /// window asked about.
    pub unknown_past_window: i64,
    /// Some of them, most recently dead first.
    pub sample: Vec<DeadJob>,
}

/// One dead job of a [`DeadJobs`] sample.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DeadJob {
    /// Its operation key.
    pub operation_key: String,
    /// Why it is dead.
    pub last_error: Option<String>,
}

/// How long common providers remember an idempotency key (Resend, Stripe, most email and
/// payment APIs: 24 h): a retry with the same key inside it is deduplicated, after it not.
pub const PROVIDER_DEDUPE_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The outbox's backlog.
#[derive(Debug, Clone, Copy, Default, PartialEq, sqlx::FromRow)]
pub struct Backlog {
    /// Pending jobs (due or waiting for a retry).
    pub pending: i64,
    /// Seconds since the oldest pending job was enqueued (0 when none).
    pub oldest_pending_seconds: f64,
    /// Parked jobs ([`JobStatus::Unknown`]): waiting to be settled.
    pub parked: i64,
    /// Seconds since the oldest parked job was parked (0 when none).
    pub oldest_parked_seconds: f64,
}

/// A parked job ([`JobStatus::Unknown`]) a look took ([`JobStore::claim_parked`]).
#[derive(Debug, Clone)]
pub struct ParkedJob {
    /// The job as its attempts saw it; its [`Job::lease_token`] is the look's.
    pub job: Job,
    /// Since when it is parked.
    pub parked_at: OffsetDateTime,
    /// How long it has been parked when the look took it, by the store's clock (on PostgreSQL
    /// the database's, which wrote `parked_at`): never a worker's clock against the database's.
    pub parked_for: Duration,
}

/// How a parked job ([`JobStatus::Unknown`]) is settled ([`JobStore::settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// The provider accepted it: recorded sent, by the next worker of its kind that claims it,
    /// without running its handler again; its follow-ups are named as for any sent job.
    Sent,
    /// The provider did not accept it: sent again, as a re-drive does — under the same
    /// delivery key and frozen payload, with a fresh attempt budget and retry horizon.
    Resend,
}

impl Settlement {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sent => "sent",
            Self::Resend => "resend",
        }
    }
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

/// Applies what both dialects' migrators share: the outbox's own history table, and tolerance
/// for versions this release does not know.
fn migrator(mut migrator: sqlx::migrate::Migrator) -> sqlx::migrate::Migrator {
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    // Migrations only add: a process of the previous release must still start (and restart)
    // on a database a newer release already migrated, so versions it does not know are fine.
    migrator.set_ignore_missing(true);
    migrator
}
