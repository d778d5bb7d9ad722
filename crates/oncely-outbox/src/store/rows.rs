//! Rows as both dialects read and write them. [`Backlog`](super::Backlog) derives `FromRow`
//! itself; a claimed job comes through [`JobRow`], a job for operators through [`RecordRow`]
//! and its attempts through [`AttemptRow`], whose moments are in the dialect's [`Moment`] type.

use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Finish, SkippedJob};
use crate::job::{AttemptRecord, Job, JobRecord, JobStatus};

/// How a dialect stores a moment: PostgreSQL as `timestamptz` ([`OffsetDateTime`]), SQLite as
/// Unix milliseconds (`i64`).
pub trait Moment: Sized {
    /// The column value of `t`.
    fn from_time(t: OffsetDateTime) -> Self;
    /// The moment a column value stands for.
    fn into_time(self) -> OffsetDateTime;
}

impl Moment for OffsetDateTime {
    fn from_time(t: OffsetDateTime) -> Self {
        t
    }

    fn into_time(self) -> OffsetDateTime {
        self
    }
}

impl Moment for i64 {
    fn from_time(t: OffsetDateTime) -> Self {
        i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
    }

    fn into_time(self) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(self) * 1_000_000)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }
}

/// Milliseconds, as both dialects take durations.
pub(crate) fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A job as a claim returns it.
#[derive(sqlx::FromRow)]
pub(crate) struct JobRow<T> {
    id: i64,
    operation_key: String,
    kind: String,
    #[sqlx(json)]
    payload: Value,
    delivery_key: Uuid,
    attempts: i32,
    free_attempts: i32,
    created_at: T,
    redriven_at: Option<T>,
    not_after: Option<T>,
    #[sqlx(json(nullable))]
    frozen: Option<Value>,
    partition_key: Option<String>,
    settled: Option<String>,
}

/// The jobs of a claim's rows, claimed under `lease_token`, in id order.
pub(crate) fn claimed<T: Moment>(rows: Vec<JobRow<T>>, lease_token: Uuid) -> Vec<Job> {
    let mut jobs: Vec<Job> = rows
        .into_iter()
        .map(|row| row.into_job(lease_token))
        .collect();
    jobs.sort_by_key(|job| job.id);
    jobs
}

impl<T: Moment> JobRow<T> {
    /// The job, claimed under `lease_token`.
    pub(crate) fn into_job(self, lease_token: Uuid) -> Job {
        Job {
            id: self.id,
            operation_key: self.operation_key,
            kind: self.kind,
            payload: self.payload,
            delivery_key: self.delivery_key,
            attempt: self.attempts,
            free_attempts: self.free_attempts,
            created_at: self.created_at.into_time(),
            redriven_at: self.redriven_at.map(Moment::into_time),
            not_after: self.not_after.map(Moment::into_time),
            lease_token,
            frozen: self.frozen,
            partition: self.partition_key,
            settled_as_sent: self.settled.as_deref() == Some("sent"),
        }
    }
}

/// A parked job as a look takes it ([`Statements::CLAIM_PARKED`](super::sql::Statements)).
#[derive(sqlx::FromRow)]
pub(crate) struct ParkedRow<T> {
    #[sqlx(flatten)]
    job: JobRow<T>,
    parked_at: Option<T>,
    parked_ms: i64,
}

impl<T: Moment> ParkedRow<T> {
    /// The job, taken by a look under `lease_token`.
    pub(crate) fn into_parked(self, lease_token: Uuid) -> super::ParkedJob {
        let job = self.job.into_job(lease_token);
        // Every parked job has a `parked_at` (FINISH sets it with the status); a row parked by
        // hand without one counts as parked since it was enqueued.
        let parked_at = self.parked_at.map_or(job.created_at, Moment::into_time);
        let parked_for = std::time::Duration::from_millis(self.parked_ms.max(0).unsigned_abs());
        super::ParkedJob {
            job,
            parked_at,
            parked_for,
        }
    }
}

/// A job as operators read it ([`Statements::JOB`](super::sql::Statements::JOB), `LIST`).
#[derive(sqlx::FromRow)]
pub(crate) struct RecordRow<T> {
    id: i64,
    operation_key: String,
    kind: String,
    status: String,
    attempts: i32,
    all_attempts: i64,
    free_attempts: i32,
    last_error: Option<String>,
    provider_message_id: Option<String>,
    #[sqlx(json)]
    payload: Value,
    delivery_key: Uuid,
    #[sqlx(json(nullable))]
    frozen: Option<Value>,
    partition_key: Option<String>,
    created_at: T,
    run_after: T,
    sent_at: Option<T>,
    dead_at: Option<T>,
    skipped_at: Option<T>,
    redriven_at: Option<T>,
    parked_at: Option<T>,
}

impl<T: Moment> From<RecordRow<T>> for JobRecord {
    fn from(row: RecordRow<T>) -> Self {
        Self {
            id: row.id,
            operation_key: row.operation_key,
            kind: row.kind,
            status: JobStatus::from(row.status),
            attempts: row.attempts,
            all_attempts: row.all_attempts,
            free_attempts: row.free_attempts,
            last_error: row.last_error,
            provider_message_id: row.provider_message_id,
            payload: row.payload,
            delivery_key: row.delivery_key,
            frozen: row.frozen,
            partition: row.partition_key,
            created_at: row.created_at.into_time(),
            run_after: row.run_after.into_time(),
            sent_at: row.sent_at.map(Moment::into_time),
            dead_at: row.dead_at.map(Moment::into_time),
            skipped_at: row.skipped_at.map(Moment::into_time),
            redriven_at: row.redriven_at.map(Moment::into_time),
            parked_at: row.parked_at.map(Moment::into_time),
        }
    }
}

/// An attempt as operators read it ([`Statements::ATTEMPTS`](super::sql::Statements::ATTEMPTS)).
#[derive(sqlx::FromRow)]
pub(crate) struct AttemptRow<T> {
    attempt: i32,
    worker: String,
    result: Option<String>,
    provider_message_id: Option<String>,
    error: Option<String>,
    started_at: T,
    finished_at: Option<T>,
    point_of_no_return: Option<String>,
    handed_over_at: Option<T>,
}

impl<T: Moment> From<AttemptRow<T>> for AttemptRecord {
    fn from(row: AttemptRow<T>) -> Self {
        Self {
            attempt: row.attempt,
            worker: row.worker,
            result: row.result,
            provider_message_id: row.provider_message_id,
            error: row.error,
            finished: row.finished_at.is_some(),
            started_at: row.started_at.into_time(),
            finished_at: row.finished_at.map(Moment::into_time),
            point_of_no_return: row.point_of_no_return,
            handed_over_at: row.handed_over_at.map(Moment::into_time),
        }
    }
}

/// A skipped job as [`Statements::SKIPPED`](super::sql::Statements::SKIPPED) returns it.
#[derive(sqlx::FromRow)]
pub(crate) struct SkippedRow<T> {
    operation_key: String,
    kind: String,
    last_error: Option<String>,
    #[sqlx(json)]
    payload: Value,
    skipped_at: T,
}

impl<T: Moment> SkippedRow<T> {
    pub(crate) fn into_job(self) -> SkippedJob {
        SkippedJob {
            operation_key: self.operation_key,
            kind: self.kind,
            reason: self.last_error,
            payload: self.payload,
            skipped_at: self.skipped_at.into_time(),
        }
    }
}

/// One finished attempt in the JSON batch `FINISH` reads (`jsonb_to_recordset` on PostgreSQL,
/// `json_each` on SQLite): one parameter for any number of results.
#[derive(Serialize)]
pub(crate) struct Done<'a> {
    id: i64,
    lease_token: Uuid,
    status: &'static str,
    retry_ms: i64,
    result: &'static str,
    provider_message_id: Option<&'a str>,
    error: Option<&'a str>,
    /// Counts in the job's `free_attempts` (throttled, paused).
    free: bool,
    /// Forgets the job's frozen payload.
    thaw: bool,
}

impl<'a> Done<'a> {
    pub(crate) fn new(job: &Job, finish: &'a Finish) -> Self {
        Self {
            id: job.id,
            lease_token: job.lease_token,
            status: finish.status.as_str(),
            retry_ms: millis(finish.retry_in),
            result: finish.result.as_str(),
            provider_message_id: finish.provider_message_id.as_deref(),
            error: finish.error.as_deref(),
            free: finish.free_attempt,
            thaw: finish.thaw,
        }
    }
}

/// One follow-up job in the JSON batch `FINISH` inserts (see [`Finish::follow_ups`]), with the
/// id and lease token of the job whose finish it comes with: inserted only if that finish is.
#[derive(Serialize)]
pub(crate) struct FollowUp<'a> {
    job_id: i64,
    lease_token: Uuid,
    operation_key: &'a str,
    kind: &'a str,
    payload: &'a Value,
    delivery_key: Uuid,
    /// Unix milliseconds.
    not_after_ms: Option<i64>,
    partition_key: Option<&'a str>,
}

impl<'a> FollowUp<'a> {
    /// The follow-ups of every finish in `done`, each with a new delivery key.
    pub(crate) fn of(done: &[(&Job, &'a Finish)]) -> Vec<Self> {
        done.iter()
            .flat_map(|(job, finish)| {
                let (job_id, lease_token) = (job.id, job.lease_token);
                finish.follow_ups.iter().map(move |new| Self {
                    job_id,
                    lease_token,
                    operation_key: &new.operation_key,
                    kind: &new.kind,
                    payload: &new.payload,
                    delivery_key: Uuid::new_v4(),
                    not_after_ms: new.not_after.map(i64::from_time),
                    partition_key: new.partition.as_deref(),
                })
            })
            .collect()
    }
}
