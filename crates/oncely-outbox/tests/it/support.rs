//! Stores per backend on a manual clock, a business table to enqueue next to, and a store that
//! lets a test fail or watch the one it wraps.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncely_outbox::job::AttemptRecord;
use oncely_outbox::store::postgres::PgJobStore;
use oncely_outbox::store::sqlite::SqliteJobStore;
use oncely_outbox::store::{
    Backlog, BulkRedrive, Clock, DeadFilter, DeadJobs, Dialect, Finish, JobFilter, ParkedJob,
    Settlement, SkippedJob, SqlJobStore, Wakeup,
};
use oncely_outbox::{Enqueued, Job, JobRecord, JobStore, NewJob, OutboxError};
use oncely_testdb::{Migrations, TestDb, TestPostgres, TestSqlite};
use sqlx::{Encode, Executor, IntoArguments, Pool, Type};
use time::OffsetDateTime;
use tokio::sync::mpsc;

/// A job store the tests can also enqueue into (in a transaction of their own) and move the
/// time of.
pub trait Backend: JobStore {
    /// Begins a transaction, writes a business row and enqueues `job`; commits if `commit`.
    /// Nothing else: the store wakes its workers by itself.
    fn enqueue_with_business_row(
        &self,
        job: NewJob,
        commit: bool,
    ) -> impl Future<Output = Result<Enqueued, OutboxError>> + Send;
    /// How many business rows committed.
    fn business_rows(&self) -> impl Future<Output = i64> + Send;
    /// The store's (manual) clock.
    fn clock(&self) -> &Clock;
    /// Runs `sql` with `id` bound as `$1`: what no store method writes (a previous release's
    /// leftovers).
    fn execute_for_test(&self, sql: &'static str, id: i64) -> impl Future<Output = ()> + Send;
}

const BUSINESS: &str = "CREATE TABLE business (note TEXT NOT NULL)";

pub async fn postgres() -> (PgJobStore, TestDb) {
    let db = migrated_postgres().await;
    let store = PgJobStore::new(db.pool(20).await).with_clock(manual_clock());
    // Up to date already (and checked so).
    store.migrate().await.unwrap();
    (store, TestDb::Postgres(Box::new(db)))
}

/// A PostgreSQL database with the outbox migrated and the business table: cloned from a
/// template (the first test to need it builds it).
pub async fn migrated_postgres() -> TestPostgres {
    let migrations = Migrations::new("outbox")
        .migrator(&oncely_outbox::store::postgres::migrator())
        .setup(BUSINESS);
    TestPostgres::migrated(&migrations, async |url: String| {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        PgJobStore::new(pool.clone()).migrate().await.unwrap();
        sqlx::query(BUSINESS).execute(&pool).await.unwrap();
        pool.close().await;
    })
    .await
}

pub async fn sqlite() -> (SqliteJobStore, TestDb) {
    let db = TestSqlite::new();
    let store = SqliteJobStore::new(db.pool(8).await).with_clock(manual_clock());
    store.migrate().await.unwrap();
    sqlx::query(BUSINESS).execute(store.pool()).await.unwrap();
    (store, TestDb::Sqlite(db))
}

/// Time stands still in the tests until one moves it.
fn manual_clock() -> Clock {
    Clock::manual(OffsetDateTime::now_utc())
}

impl<D: Dialect> Backend for SqlJobStore<D>
where
    SqlJobStore<D>: JobStore<Database = D>,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'c> &'c Pool<D>: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> i64: Encode<'q, D> + Type<D>,
    for<'r> (i64,): sqlx::FromRow<'r, D::Row>,
{
    async fn enqueue_with_business_row(
        &self,
        job: NewJob,
        commit: bool,
    ) -> Result<Enqueued, OutboxError> {
        let begin = D::WRITE_TRANSACTION.unwrap_or("BEGIN");
        let mut tx = self.pool().begin_with(begin).await?;
        sqlx::query("INSERT INTO business (note) VALUES ($1)")
            .bind(job.operation_key.as_str())
            .execute(&mut *tx)
            .await?;
        let enqueued = self.enqueue(&mut tx, &job).await?;
        if commit {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok(enqueued)
    }

    async fn business_rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM business")
            .fetch_one(self.pool())
            .await
            .unwrap()
    }

    fn clock(&self) -> &Clock {
        SqlJobStore::clock(self)
    }

    async fn execute_for_test(&self, sql: &'static str, id: i64) {
        sqlx::query(sql)
            .bind(id)
            .execute(self.pool())
            .await
            .unwrap();
    }
}

pub fn kinds(k: &[&str]) -> Vec<String> {
    k.iter().map(|s| (*s).to_owned()).collect()
}

pub const LEASE: Duration = Duration::from_secs(30);

macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        oncely_testdb::both_stores!(crate::support::postgres, crate::support::sqlite; $($name),*);
    };
}
pub(crate) use both_stores;

/// What a [`Spy`] saw of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// A claim began.
    Started,
    /// A claim returned this many jobs.
    Returned(usize),
}

/// A store that delegates to `inner`, and can fail its `finish_all`, report its claims, and
/// enqueue a job right after a claim returned (before the worker waits again).
#[derive(Clone)]
pub struct Spy<S> {
    pub inner: S,
    /// `finish_all` fails this many more times, as a dropped connection would.
    pub finish_failures: Arc<AtomicU32>,
    /// `finish_all` calls so far.
    pub finish_calls: Arc<AtomicU32>,
    /// Enqueued (and committed) right after the next claim, before it returns.
    pub enqueue_after_claim: Arc<Mutex<Option<NewJob>>>,
    claims: Option<mpsc::UnboundedSender<Claim>>,
}

impl<S: Backend> Spy<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            finish_failures: Arc::default(),
            finish_calls: Arc::default(),
            enqueue_after_claim: Arc::default(),
            claims: None,
        }
    }

    /// A spy that reports its claims.
    pub fn watching(inner: S) -> (Self, mpsc::UnboundedReceiver<Claim>) {
        let (claims, watched) = mpsc::unbounded_channel();
        let spy = Self {
            claims: Some(claims),
            ..Self::new(inner)
        };
        (spy, watched)
    }

    fn saw(&self, claim: Claim) {
        if let Some(claims) = &self.claims {
            let _ = claims.send(claim);
        }
    }
}

impl<S: Backend> Backend for Spy<S> {
    async fn enqueue_with_business_row(
        &self,
        job: NewJob,
        commit: bool,
    ) -> Result<Enqueued, OutboxError> {
        self.inner.enqueue_with_business_row(job, commit).await
    }
    async fn business_rows(&self) -> i64 {
        self.inner.business_rows().await
    }
    fn clock(&self) -> &Clock {
        self.inner.clock()
    }
    async fn execute_for_test(&self, sql: &'static str, id: i64) {
        self.inner.execute_for_test(sql, id).await;
    }
}

impl<S: Backend> JobStore for Spy<S> {
    type Database = S::Database;

    async fn migrate(&self) -> Result<(), OutboxError> {
        self.inner.migrate().await
    }
    async fn enqueue(
        &self,
        conn: &mut <S::Database as sqlx::Database>::Connection,
        job: &NewJob,
    ) -> Result<Enqueued, OutboxError> {
        self.inner.enqueue(conn, job).await
    }
    async fn claim(
        &self,
        worker: &str,
        kinds: &[String],
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<Job>, OutboxError> {
        self.saw(Claim::Started);
        let jobs = self.inner.claim(worker, kinds, limit, lease).await?;
        let after = self.enqueue_after_claim.lock().unwrap().take();
        if let Some(job) = after {
            self.inner.enqueue_with_business_row(job, true).await?;
        }
        self.saw(Claim::Returned(jobs.len()));
        Ok(jobs)
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
        self.saw(Claim::Started);
        let jobs = self
            .inner
            .claim_partitioned(worker, kind, limit, per_partition, running, lease)
            .await?;
        self.saw(Claim::Returned(jobs.len()));
        Ok(jobs)
    }
    async fn finish_all(&self, done: &[(&Job, &Finish)]) -> Result<Vec<bool>, OutboxError> {
        self.finish_calls.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .finish_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(OutboxError::Database(sqlx::Error::PoolTimedOut));
        }
        self.inner.finish_all(done).await
    }
    async fn freeze(
        &self,
        job: &Job,
        frozen: &serde_json::Value,
    ) -> Result<Option<serde_json::Value>, OutboxError> {
        self.inner.freeze(job, frozen).await
    }
    async fn release(&self, job: &Job) -> Result<bool, OutboxError> {
        self.inner.release(job).await
    }
    fn wake(&self) {
        self.inner.wake();
    }
    fn wakeup(&self, kinds: &[String]) -> Wakeup {
        self.inner.wakeup(kinds)
    }
    fn now(&self) -> OffsetDateTime {
        self.inner.now()
    }
    async fn job(&self, operation_key: &str) -> Result<Option<JobRecord>, OutboxError> {
        self.inner.job(operation_key).await
    }
    async fn job_by_id(&self, id: i64) -> Result<Option<JobRecord>, OutboxError> {
        self.inner.job_by_id(id).await
    }
    async fn attempts(&self, job_id: i64) -> Result<Vec<AttemptRecord>, OutboxError> {
        self.inner.attempts(job_id).await
    }
    async fn pending(&self) -> Result<i64, OutboxError> {
        self.inner.pending().await
    }
    async fn prune(&self, older_than: Duration, limit: u32) -> Result<u64, OutboxError> {
        self.inner.prune(older_than, limit).await
    }
    async fn skipped(&self, limit: u32) -> Result<Vec<SkippedJob>, OutboxError> {
        self.inner.skipped(limit).await
    }
    async fn backlog(&self) -> Result<Backlog, OutboxError> {
        self.inner.backlog().await
    }
    async fn list(&self, filter: &JobFilter) -> Result<Vec<JobRecord>, OutboxError> {
        self.inner.list(filter).await
    }
    async fn redrive(&self, operation_key: &str) -> Result<bool, OutboxError> {
        self.inner.redrive(operation_key).await
    }
    async fn settle(&self, id: i64, settlement: Settlement) -> Result<bool, OutboxError> {
        self.inner.settle(id, settlement).await
    }
    async fn claim_parked(
        &self,
        kinds: &[String],
        limit: u32,
        look: Duration,
    ) -> Result<Vec<ParkedJob>, OutboxError> {
        self.inner.claim_parked(kinds, limit, look).await
    }
    async fn settle_looked(
        &self,
        parked: &ParkedJob,
        settlement: Settlement,
        provider_message_id: Option<&str>,
        parked_at_least: Option<Duration>,
    ) -> Result<bool, OutboxError> {
        self.inner
            .settle_looked(parked, settlement, provider_message_id, parked_at_least)
            .await
    }
    async fn look_later(&self, parked: &ParkedJob, after: Duration) -> Result<bool, OutboxError> {
        self.inner.look_later(parked, after).await
    }
    async fn dead_jobs(
        &self,
        filter: &DeadFilter,
        sample: u32,
        window: Duration,
    ) -> Result<DeadJobs, OutboxError> {
        self.inner.dead_jobs(filter, sample, window).await
    }
    async fn redrive_dead(
        &self,
        filter: &DeadFilter,
        expect: Option<u64>,
    ) -> Result<BulkRedrive, OutboxError> {
        self.inner.redrive_dead(filter, expect).await
    }
}

/// A mailer to `url` (SMTP or HTTP), each send bounded by `timeout`.
pub fn mailer(url: &str, timeout: Duration) -> Arc<dyn oncely_outbox::mail::Mailer> {
    oncely_outbox::mail::from_url(url, None, timeout, None).unwrap()
}

/// The result of each attempt of job `id`, in order (`open`: not finished).
pub async fn results<S: Backend>(store: &S, id: i64) -> Vec<String> {
    store
        .attempts(id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.result.unwrap_or_else(|| "open".into()))
        .collect()
}

/// The results of the finished attempts of job `id`, in order.
pub async fn finished_attempts<S: Backend>(store: &S, id: i64) -> Vec<String> {
    let attempts = store.attempts(id).await.unwrap();
    attempts.into_iter().filter_map(|a| a.result).collect()
}

/// The results of the finished attempts of the job `key`, in order.
pub async fn finished_results<S: Backend>(store: &S, key: &str) -> Vec<String> {
    let id = store.job(key).await.unwrap().unwrap().id;
    finished_attempts(store, id).await
}

/// The job `key`, asserted to be in `status`.
pub async fn job_in<S: Backend>(
    store: &S,
    key: &str,
    status: oncely_outbox::JobStatus,
) -> JobRecord {
    let record = store.job(key).await.unwrap().unwrap();
    assert_eq!(record.status, status, "{record:?}");
    record
}

/// The status of the job `key`.
pub async fn status<S: Backend>(store: &S, key: &str) -> oncely_outbox::JobStatus {
    store.job(key).await.unwrap().unwrap().status
}

/// The jobs whose status is `status`.
pub async fn listed<S: Backend>(store: &S, status: oncely_outbox::JobStatus) -> Vec<JobRecord> {
    store
        .list(&JobFilter {
            status: Some(status),
            ..JobFilter::default()
        })
        .await
        .unwrap()
}

/// A worker's default configuration but for its batch.
pub fn batch_of(batch: u32) -> oncely_outbox::WorkerConfig {
    oncely_outbox::WorkerConfig {
        batch,
        ..oncely_outbox::WorkerConfig::default()
    }
}

/// An email from `oncely@localhost` to `to`, subject `Hello`, body `text`.
pub fn email_to(to: &str, text: &str) -> oncely_outbox::mail::Email {
    oncely_outbox::mail::Email {
        from: "oncely@localhost".into(),
        to: to.into(),
        subject: "Hello".into(),
        text: text.into(),
        ..Default::default()
    }
}

/// An email job `key` to `<key>@example.com` (kind `email`).
pub fn email_job(key: &str) -> NewJob {
    let email = email_to(&format!("{key}@example.com"), "hi");
    NewJob::new(key, "email", serde_json::to_value(email).unwrap())
}

/// Enqueues `email_job(key)` for each of `keys`, each with its business row.
pub async fn enqueue_emails<S: Backend>(store: &S, keys: &[&str]) {
    for key in keys {
        store
            .enqueue_with_business_row(email_job(key), true)
            .await
            .unwrap();
    }
}

/// Every run of a handler: the job's operation key and delivery key.
#[derive(Clone, Default)]
pub struct Runs(Arc<Mutex<Vec<(String, uuid::Uuid)>>>);

impl Runs {
    /// Notes a run of `job`; which run of its job it is (1 for the first).
    pub fn record(&self, job: &Job) -> usize {
        let mut runs = self.0.lock().unwrap();
        runs.push((job.operation_key.clone(), job.delivery_key));
        runs.iter().filter(|(k, _)| *k == job.operation_key).count()
    }

    /// The delivery key of each run of the job `key`, in order.
    pub fn of(&self, key: &str) -> Vec<uuid::Uuid> {
        let runs = self.0.lock().unwrap();
        runs.iter()
            .filter(|(k, _)| k == key)
            .map(|(_, d)| *d)
            .collect()
    }
}

/// A handler that tells the test which job it ran (its operation key), and sends it.
pub struct Report(pub mpsc::UnboundedSender<String>);

impl oncely_outbox::Handler for Report {
    fn run<'a>(
        &'a self,
        job: &'a Job,
    ) -> std::pin::Pin<Box<dyn Future<Output = oncely_outbox::Delivery> + Send + 'a>> {
        let _ = self.0.send(job.operation_key.clone());
        Box::pin(async {
            oncely_outbox::Delivery::Sent {
                provider_message_id: None,
            }
        })
    }
}

/// Waits until a watched worker's claim returned nothing: it waits for a wake-up (or its poll)
/// now.
pub async fn idle(claims: &mut mpsc::UnboundedReceiver<Claim>) {
    let empty = async {
        while let Some(claim) = claims.recv().await {
            if claim == Claim::Returned(0) {
                return;
            }
        }
        panic!("the worker stopped");
    };
    tokio::time::timeout(Duration::from_secs(10), empty)
        .await
        .expect("the worker claims at start");
}

/// A store of its own on a test's database, as another process would have: a pool of
/// `connections`, the system clock (leases and deadlines pass in real time).
pub trait Fresh: Backend + Sized {
    fn fresh(db: &TestDb, connections: u32) -> impl Future<Output = Self> + Send;
}

impl Fresh for PgJobStore {
    async fn fresh(db: &TestDb, connections: u32) -> Self {
        PgJobStore::new(db.postgres().pool(connections).await)
    }
}

impl Fresh for SqliteJobStore {
    async fn fresh(db: &TestDb, connections: u32) -> Self {
        let TestDb::Sqlite(db) = db else {
            panic!("not a SQLite test database")
        };
        SqliteJobStore::new(db.pool(connections).await)
    }
}
