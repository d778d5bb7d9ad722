//! The job store, written once: [`SqlJobStore`] runs the statements of its [`Dialect`] — what a
//! database brings (river calls it the driver): its SQL under shared names, how it stores a
//! moment, whether a write needs a transaction of its own, and how idle workers learn of jobs.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use oncely_sql::{Conn, Db};
use sqlx::migrate::{Migrate, Migrator};
use sqlx::types::Json;
use sqlx::{Database, Decode, Encode, Executor, IntoArguments, Pool, Type};
use time::OffsetDateTime;
use uuid::Uuid;

use super::rows::{
    AttemptRow, Done, FollowUp, JobRow, Moment, ParkedRow, RecordRow, SkippedRow, claimed, millis,
};
use super::sql::Statements;
use super::{
    Backlog, BulkRedrive, Clock, DeadFilter, DeadJob, DeadJobs, Finish, JobFilter, JobStore,
    OutboxError, ParkedJob, Settlement, SkippedJob, Wakeup,
};
use crate::job::{AttemptRecord, Enqueued, Job, JobRecord, NewJob};

/// Binds a [`DeadFilter`] as the statements take it: 1 kind, 2 since, 3 reason, 4 until.
macro_rules! bind_filter {
    ($query:expr, $filter:expr) => {{
        let filter: &DeadFilter = $filter;
        $query
            .bind(filter.kind.as_deref())
            .bind(filter.since.map(D::Moment::from_time))
            .bind(filter.reason_contains.as_deref())
            .bind(filter.until.map(D::Moment::from_time))
    }};
}

/// A database the outbox runs on: `sqlx::Postgres` (feature `postgres`) or `sqlx::Sqlite`
/// (feature `sqlite`). Sealed: its statements live in this crate.
pub trait Dialect: Database + Statements {
    /// A moment as a column: `timestamptz` on PostgreSQL, Unix milliseconds on SQLite.
    type Moment: Moment
        + for<'q> Encode<'q, Self>
        + for<'r> Decode<'r, Self>
        + Type<Self>
        + Send
        + Unpin
        + 'static;

    /// A store's wake-up machinery (shared by its clones).
    type Waker: fmt::Debug + Send + Sync + 'static;

    /// How a write of several statements begins (`BEGIN IMMEDIATE` on SQLite: it waits for the
    /// one writer lock up front instead of failing on upgrade); `None` where every write is one
    /// statement (PostgreSQL: CTEs), which needs no transaction of its own.
    const WRITE_TRANSACTION: Option<&'static str>;

    /// The outbox's migrations.
    fn migrator() -> Migrator;

    /// A new store's waker.
    fn waker(db: &Db<Self>) -> Self::Waker;

    /// The `now` every time-dependent statement binds: on PostgreSQL `None` unless the clock is
    /// manual (the statements say `COALESCE($n, now())`: the database's clock), on SQLite the
    /// clock's time.
    fn now(clock: &Clock) -> Option<Self::Moment>;

    /// Sees that workers of `kind` learn of a job `enqueue` inserted on `conn` (in the caller's
    /// transaction) once it commits.
    fn enqueued(
        waker: &Self::Waker,
        conn: &mut Self::Connection,
        kind: &str,
    ) -> impl Future<Output = Result<(), OutboxError>> + Send;

    /// Wakes idle workers of every kind for jobs that are committed already.
    fn wake(waker: &Self::Waker);

    /// How an idle worker of `kinds` waits for jobs (see [`JobStore::wakeup`]).
    fn wakeup(waker: &Self::Waker, kinds: &[String]) -> Wakeup;
}

/// A [`JobStore`] on a database pool: [`PgJobStore`](super::postgres::PgJobStore) or
/// [`SqliteJobStore`](super::sqlite::SqliteJobStore).
pub struct SqlJobStore<D: Dialect> {
    db: Db<D>,
    clock: Clock,
    pub(super) waker: Arc<D::Waker>,
}

impl<D: Dialect> SqlJobStore<D> {
    /// A store on `pool`, on the system clock.
    pub fn new(pool: Pool<D>) -> Self {
        Self::on(Db::direct(pool))
    }

    /// A store on `db`: a pool as [`Db`] says how to use it (e.g. behind a transaction-mode
    /// pooler, see [`oncely_sql::Pooling`]; or with settings of its own, such as a worker's
    /// `lock_timeout`), on the system clock.
    pub fn on(db: Db<D>) -> Self {
        Self {
            waker: Arc::new(D::waker(&db)),
            db,
            clock: Clock::system(),
        }
    }

    /// Reads the time from `clock` (tests: [`Clock::manual`]).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<D> {
        self.db.pool()
    }

    /// The pool as this store uses it.
    pub fn db(&self) -> &Db<D> {
        &self.db
    }

    /// The clock it reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    fn now_param(&self) -> Option<D::Moment> {
        D::now(&self.clock)
    }

    /// A connection for one write; see [`Dialect::WRITE_TRANSACTION`].
    async fn write(&self) -> Result<Conn<D>, sqlx::Error> {
        match D::WRITE_TRANSACTION {
            Some(begin) => Ok(Conn::Transaction(self.db.begin_with(begin).await?)),
            None => self.db.connection().await,
        }
    }
}

impl<D: Dialect> SqlJobStore<D>
where
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'c> &'c Pool<D>: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'q> i64: Encode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> Option<&'q str>: Encode<'q, D> + Type<D>,
    for<'q> Option<D::Moment>: Encode<'q, D> + Type<D>,
    for<'q> Option<Uuid>: Encode<'q, D> + Type<D>,
    for<'q> Option<i64>: Encode<'q, D> + Type<D>,
    for<'r> (i64,): sqlx::FromRow<'r, D::Row>,
{
    /// [`JobStore::settle`] by an operator (`look`: `(None, None)`) or by a look holding the
    /// job (its lease token, and how long the job must have been parked, if at all).
    async fn settle_as(
        &self,
        id: i64,
        settlement: Settlement,
        (look, parked_at_least): (Option<Uuid>, Option<Duration>),
        provider_message_id: Option<&str>,
    ) -> Result<bool, OutboxError> {
        let settled: Option<i64> = sqlx::query_scalar(D::SETTLE)
            .bind(id)
            .bind(settlement.as_str())
            .bind(self.now_param())
            .bind(look)
            .bind(provider_message_id)
            .bind(parked_at_least.map(millis))
            .fetch_optional(&self.db)
            .await?;
        let settled = settled.is_some();
        if settled {
            D::wake(&self.waker);
        }
        Ok(settled)
    }
}

impl<D: Dialect> Clone for SqlJobStore<D> {
    fn clone(&self) -> Self {
        Self {
            db: self.db.clone(),
            clock: self.clock.clone(),
            waker: self.waker.clone(),
        }
    }
}

impl<D: Dialect> fmt::Debug for SqlJobStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlJobStore")
            .field("database", &D::NAME)
            .field("clock", &self.clock)
            .field("waker", &self.waker)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> JobStore for SqlJobStore<D>
where
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'c> &'c Pool<D>: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    D::Connection: Migrate,
    for<'q> i64: Encode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> Option<&'q str>: Encode<'q, D> + Type<D>,
    for<'q> Option<D::Moment>: Encode<'q, D> + Type<D>,
    for<'q> Uuid: Encode<'q, D> + Type<D>,
    for<'q> Option<Uuid>: Encode<'q, D> + Type<D>,
    for<'q> Option<i64>: Encode<'q, D> + Type<D>,
    for<'q, 'j> Json<&'j serde_json::Value>: Encode<'q, D> + Type<D>,
    for<'q, 'j> Json<&'j [String]>: Encode<'q, D> + Type<D>,
    for<'q, 'j> Json<&'j [i64]>: Encode<'q, D> + Type<D>,
    for<'q, 'j> Json<&'j [Done<'j>]>: Encode<'q, D> + Type<D>,
    for<'q, 'j> Json<&'j [FollowUp<'j>]>: Encode<'q, D> + Type<D>,
    for<'q, 'j> Json<&'j HashMap<String, u32>>: Encode<'q, D> + Type<D>,
    for<'r> (Option<i64>, Option<String>): sqlx::FromRow<'r, D::Row>,
    for<'r> (i64,): sqlx::FromRow<'r, D::Row>,
    for<'r> (i64, i64, D::Moment): sqlx::FromRow<'r, D::Row>,
    for<'r> DeadJob: sqlx::FromRow<'r, D::Row>,
    for<'r> (Json<serde_json::Value>,): sqlx::FromRow<'r, D::Row>,
    for<'r> SkippedRow<D::Moment>: sqlx::FromRow<'r, D::Row>,
    for<'r> JobRow<D::Moment>: sqlx::FromRow<'r, D::Row>,
    for<'r> ParkedRow<D::Moment>: sqlx::FromRow<'r, D::Row>,
    for<'r> RecordRow<D::Moment>: sqlx::FromRow<'r, D::Row>,
    for<'r> AttemptRow<D::Moment>: sqlx::FromRow<'r, D::Row>,
    for<'r> Backlog: sqlx::FromRow<'r, D::Row>,
{
    type Database = D;

    async fn migrate(&self) -> Result<(), OutboxError> {
        D::migrator().run(self.db.pool()).await?;
        Ok(())
    }

    async fn enqueue(
        &self,
        conn: &mut D::Connection,
        job: &NewJob,
    ) -> Result<Enqueued, OutboxError> {
        let id: Option<i64> = sqlx::query_scalar(D::ENQUEUE)
            .bind(job.operation_key.as_str())
            .bind(job.kind.as_str())
            .bind(Json(&job.payload))
            .bind(Uuid::new_v4())
            .bind(job.not_after.map(D::Moment::from_time))
            .bind(self.now_param())
            .bind(job.partition.as_deref())
            .fetch_optional(&mut *conn)
            .await?;
        let Some(id) = id else {
            return Ok(Enqueued::AlreadyExists);
        };
        D::enqueued(&self.waker, conn, &job.kind).await?;
        Ok(Enqueued::Inserted(id))
    }

    async fn claim(
        &self,
        worker: &str,
        kinds: &[String],
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<Job>, OutboxError> {
        self.claim_marking(worker, kinds, limit, lease, &[]).await
    }

    async fn claim_marking(
        &self,
        worker: &str,
        kinds: &[String],
        limit: u32,
        lease: Duration,
        marking: &[String],
    ) -> Result<Vec<Job>, OutboxError> {
        let token = Uuid::new_v4();
        let mut write = self.write().await?;
        let rows: Vec<JobRow<D::Moment>> = sqlx::query_as(D::CLAIM)
            .bind(self.now_param())
            .bind(millis(lease))
            .bind(token)
            .bind(Json(kinds))
            .bind(i64::from(limit))
            .bind(worker)
            .bind(Json(marking))
            .fetch_all(&mut *write)
            .await?;
        write.done().await?;
        Ok(claimed(rows, token))
    }

    async fn claim_partitioned(
        &self,
        worker: &str,
        kind: &str,
        limit: u32,
        per_partition: u32,
        running: &HashMap<String, u32>,
        lease: Duration,
    ) -> Result<Vec<Job>, OutboxError> {
        self.claim_partitioned_marking(worker, kind, limit, per_partition, running, lease, false)
            .await
    }

    async fn claim_partitioned_marking(
        &self,
        worker: &str,
        kind: &str,
        limit: u32,
        per_partition: u32,
        running: &HashMap<String, u32>,
        lease: Duration,
        marking: bool,
    ) -> Result<Vec<Job>, OutboxError> {
        let token = Uuid::new_v4();
        let kinds = [kind.to_owned()];
        let marking: &[String] = if marking { &kinds } else { &[] };
        let mut write = self.write().await?;
        let rows: Vec<JobRow<D::Moment>> = sqlx::query_as(D::CLAIM_PARTITIONED)
            .bind(self.now_param())
            .bind(millis(lease))
            .bind(token)
            .bind(Json(&kinds[..]))
            .bind(i64::from(limit))
            .bind(worker)
            .bind(i64::from(per_partition))
            .bind(Json(running))
            .bind(Json(marking))
            .fetch_all(&mut *write)
            .await?;
        write.done().await?;
        Ok(claimed(rows, token))
    }

    async fn finish_all(&self, done: &[(&Job, &Finish)]) -> Result<Vec<bool>, OutboxError> {
        if done.is_empty() {
            return Ok(Vec::new());
        }
        let batch: Vec<Done<'_>> = done.iter().map(|(job, f)| Done::new(job, f)).collect();
        let follow_ups = FollowUp::of(done);
        let mut write = self.write().await?;
        let rows: Vec<(Option<i64>, Option<String>)> = sqlx::query_as(D::FINISH)
            .bind(Json(batch.as_slice()))
            .bind(self.now_param())
            .bind(Json(follow_ups.as_slice()))
            .fetch_all(&mut *write)
            .await?;
        let finished: Vec<i64> = rows.iter().filter_map(|(id, _)| *id).collect();
        // The follow-ups' workers learn of them as of any enqueue's: on PostgreSQL the write
        // above committed already (one statement), on SQLite the claim a signal starts waits for
        // this transaction's commit.
        let mut kinds: Vec<&str> = rows.iter().filter_map(|(_, k)| k.as_deref()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        for kind in kinds {
            // Never fails the finish: on PostgreSQL it is written already, and the workers
            // find the follow-ups at their next poll.
            if let Err(error) = D::enqueued(&self.waker, &mut write, kind).await {
                tracing::warn!(%error, kind, "could not wake the workers of follow-up jobs; they find them at their next poll");
            }
        }
        write.done().await?;
        Ok(done
            .iter()
            .map(|(job, _)| finished.contains(&job.id))
            .collect())
    }

    async fn freeze(
        &self,
        job: &Job,
        frozen: &serde_json::Value,
    ) -> Result<Option<serde_json::Value>, OutboxError> {
        let stored: Option<Json<serde_json::Value>> = sqlx::query_scalar(D::FREEZE)
            .bind(job.id)
            .bind(job.lease_token)
            .bind(Json(frozen))
            .fetch_optional(&self.db)
            .await?;
        Ok(stored.map(|Json(value)| value))
    }

    async fn pass_point_of_no_return(&self, job: &Job) -> Result<bool, OutboxError> {
        let passed: Option<i64> = sqlx::query_scalar(D::PASS)
            .bind(job.id)
            .bind(job.lease_token)
            .bind(self.now_param())
            .fetch_optional(&self.db)
            .await?;
        Ok(passed.is_some())
    }

    async fn release(&self, job: &Job) -> Result<bool, OutboxError> {
        let mut write = self.write().await?;
        let released: Vec<i64> = sqlx::query_scalar(D::RELEASE)
            .bind(job.id)
            .bind(job.lease_token)
            .bind(self.now_param())
            .fetch_all(&mut *write)
            .await?;
        write.done().await?;
        if released.is_empty() {
            return Ok(false);
        }
        // Due now: a worker that runs its kind may be idle.
        self.wake();
        Ok(true)
    }

    fn wake(&self) {
        D::wake(&self.waker);
    }

    fn wakeup(&self, kinds: &[String]) -> Wakeup {
        D::wakeup(&self.waker, kinds)
    }

    fn now(&self) -> OffsetDateTime {
        self.clock.now()
    }

    async fn job(&self, operation_key: &str) -> Result<Option<JobRecord>, OutboxError> {
        let row: Option<RecordRow<D::Moment>> = sqlx::query_as(D::JOB)
            .bind(operation_key)
            .fetch_optional(&self.db)
            .await?;
        Ok(row.map(JobRecord::from))
    }

    async fn job_by_id(&self, id: i64) -> Result<Option<JobRecord>, OutboxError> {
        let row: Option<RecordRow<D::Moment>> = sqlx::query_as(D::JOB_BY_ID)
            .bind(id)
            .fetch_optional(&self.db)
            .await?;
        Ok(row.map(JobRecord::from))
    }

    async fn attempts(&self, job_id: i64) -> Result<Vec<AttemptRecord>, OutboxError> {
        let rows: Vec<AttemptRow<D::Moment>> = sqlx::query_as(D::ATTEMPTS)
            .bind(job_id)
            .fetch_all(&self.db)
            .await?;
        Ok(rows.into_iter().map(AttemptRecord::from).collect())
    }

    async fn pending(&self) -> Result<i64, OutboxError> {
        Ok(sqlx::query_scalar(D::PENDING).fetch_one(&self.db).await?)
    }

    async fn prune(&self, older_than: Duration, limit: u32) -> Result<u64, OutboxError> {
        let pruned: Vec<i64> = sqlx::query_scalar(D::PRUNE)
            .bind(millis(older_than))
            .bind(i64::from(limit))
            .bind(self.now_param())
            .fetch_all(&self.db)
            .await?;
        Ok(pruned.len() as u64)
    }

    async fn skipped(&self, limit: u32) -> Result<Vec<SkippedJob>, OutboxError> {
        let rows: Vec<SkippedRow<D::Moment>> = sqlx::query_as(D::SKIPPED)
            .bind(i64::from(limit))
            .fetch_all(&self.db)
            .await?;
        Ok(rows.into_iter().map(SkippedRow::into_job).collect())
    }

    async fn backlog(&self) -> Result<Backlog, OutboxError> {
        Ok(sqlx::query_as(D::BACKLOG)
            .bind(self.now_param())
            .fetch_one(&self.db)
            .await?)
    }

    async fn list(&self, filter: &JobFilter) -> Result<Vec<JobRecord>, OutboxError> {
        let rows: Vec<RecordRow<D::Moment>> = sqlx::query_as(D::LIST)
            .bind(filter.kind.as_deref())
            .bind(filter.status())
            .bind(filter.limit())
            .fetch_all(&self.db)
            .await?;
        Ok(rows.into_iter().map(JobRecord::from).collect())
    }

    async fn redrive(&self, operation_key: &str) -> Result<bool, OutboxError> {
        let redriven: Option<i64> = sqlx::query_scalar(D::REDRIVE)
            .bind(operation_key)
            .bind(self.now_param())
            .fetch_optional(&self.db)
            .await?;
        let redriven = redriven.is_some();
        if redriven {
            self.wake();
        }
        Ok(redriven)
    }

    async fn settle(&self, id: i64, settlement: Settlement) -> Result<bool, OutboxError> {
        self.settle_as(id, settlement, (None, None), None).await
    }

    async fn claim_parked(
        &self,
        kinds: &[String],
        limit: u32,
        look: Duration,
    ) -> Result<Vec<ParkedJob>, OutboxError> {
        let token = Uuid::new_v4();
        let mut write = self.write().await?;
        let rows: Vec<ParkedRow<D::Moment>> = sqlx::query_as(D::CLAIM_PARKED)
            .bind(self.now_param())
            .bind(millis(look))
            .bind(token)
            .bind(Json(kinds))
            .bind(i64::from(limit))
            .fetch_all(&mut *write)
            .await?;
        write.done().await?;
        let mut parked: Vec<ParkedJob> =
            rows.into_iter().map(|row| row.into_parked(token)).collect();
        parked.sort_by_key(|p| p.job.id);
        Ok(parked)
    }

    async fn settle_looked(
        &self,
        parked: &ParkedJob,
        settlement: Settlement,
        provider_message_id: Option<&str>,
        parked_at_least: Option<Duration>,
    ) -> Result<bool, OutboxError> {
        let job = &parked.job;
        let look = (Some(job.lease_token), parked_at_least);
        self.settle_as(job.id, settlement, look, provider_message_id)
            .await
    }

    async fn look_later(&self, parked: &ParkedJob, after: Duration) -> Result<bool, OutboxError> {
        let released: Option<i64> = sqlx::query_scalar(D::LOOK_LATER)
            .bind(parked.job.id)
            .bind(parked.job.lease_token)
            .bind(self.now_param())
            .bind(millis(after))
            .fetch_optional(&self.db)
            .await?;
        Ok(released.is_some())
    }

    async fn dead_jobs(
        &self,
        filter: &DeadFilter,
        sample: u32,
        window: Duration,
    ) -> Result<DeadJobs, OutboxError> {
        let (matching, unknown_past_window, as_of): (i64, i64, D::Moment) =
            bind_filter!(sqlx::query_as(D::DEAD_COUNT), filter)
                .bind(self.now_param())
                .bind(millis(window))
                .fetch_one(&self.db)
                .await?;
        let sample = bind_filter!(sqlx::query_as(D::DEAD_SAMPLE), filter)
            .bind(i64::from(sample))
            .fetch_all(&self.db)
            .await?;
        Ok(DeadJobs {
            as_of: as_of.into_time(),
            matching,
            unknown_past_window,
            sample,
        })
    }

    async fn redrive_dead(
        &self,
        filter: &DeadFilter,
        expect: Option<u64>,
    ) -> Result<BulkRedrive, OutboxError> {
        // One transaction for the count and the re-drive; see `Statements::DEAD_IDS`.
        let begin = D::WRITE_TRANSACTION.unwrap_or("BEGIN");
        let mut tx = self.db.begin_with(begin).await?;
        let ids: Vec<i64> = bind_filter!(sqlx::query_scalar(D::DEAD_IDS), filter)
            .fetch_all(&mut *tx)
            .await?;
        let matching = ids.len() as u64;
        if expect.is_some_and(|expected| expected != matching) {
            tx.rollback().await?;
            return Ok(BulkRedrive::CountDiffers { matching });
        }
        if ids.is_empty() {
            tx.rollback().await?;
            return Ok(BulkRedrive::Redriven(0));
        }
        let redriven: Vec<i64> = sqlx::query_scalar(D::REDRIVE_IDS)
            .bind(Json(ids.as_slice()))
            .bind(self.now_param())
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        self.wake();
        Ok(BulkRedrive::Redriven(redriven.len() as u64))
    }
}
