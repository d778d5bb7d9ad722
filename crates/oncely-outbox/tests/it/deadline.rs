//! The send's deadline: a handler is stopped before its claim's lease ends, however long the
//! claim waited — the deadline counts from before the claim, as the lease does. These tests run
//! on the system clock (a lock is held in real time) with a short lease.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use oncely_outbox::JobStore;
use oncely_outbox::store::postgres::PgJobStore;
use oncely_outbox::store::sqlite::SqliteJobStore;
use oncely_outbox::{Delivery, Handler, Job, JobStatus, NewJob, RetryPolicy, Worker, WorkerConfig};
use oncely_testdb::TestDb;
use sqlx::{Connection, PgConnection, SqliteConnection};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::{Fresh, Spy, both_stores, idle};

const LEASE: Duration = Duration::from_secs(3);

/// How long the claims wait for the lock: half the lease.
const LOCKED_FOR: Duration = Duration::from_millis(1500);

/// A first attempt that outlives the lease, then quick ones; counts how many run at once and
/// when the first began.
#[derive(Clone, Default)]
struct Slow {
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    first_started: Arc<std::sync::Mutex<Option<Instant>>>,
}

/// One running attempt of [`Slow`]: counted until its future is dropped (finished or stopped).
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl Handler for Slow {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(async move {
            let now = self.running.fetch_add(1, SeqCst) + 1;
            let _running = Running(self.running.clone());
            self.most.fetch_max(now, SeqCst);
            self.first_started
                .lock()
                .unwrap()
                .get_or_insert_with(Instant::now);
            if job.attempt == 1 {
                tokio::time::sleep(LEASE * 4).await;
            }
            Delivery::Sent {
                provider_message_id: None,
            }
        })
    }
}

/// A transaction, on a connection of its own, that holds what every claim needs and enqueues
/// the job, which commits when the lock is released: SQLite's write lock (`BEGIN IMMEDIATE`); on
/// PostgreSQL a lock on the attempts table, which a claim (its statement prepared already) waits
/// for after it began, so after its `now()`, where its lease starts.
enum Lock {
    Sqlite(SqliteConnection),
    Postgres(PgConnection),
}

/// A store whose claims a [`Lock`] can hold up.
trait Lockable: Fresh {
    fn lock_with(&self, db: &TestDb, job: &NewJob) -> impl Future<Output = Lock> + Send;
}

impl Lockable for SqliteJobStore {
    async fn lock_with(&self, db: &TestDb, job: &NewJob) -> Lock {
        let TestDb::Sqlite(db) = db else {
            unreachable!()
        };
        let mut conn = SqliteConnection::connect(db.url()).await.unwrap();
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .unwrap();
        self.enqueue(&mut conn, job).await.unwrap();
        Lock::Sqlite(conn)
    }
}

impl Lockable for PgJobStore {
    async fn lock_with(&self, db: &TestDb, job: &NewJob) -> Lock {
        let mut conn = PgConnection::connect(db.postgres().url()).await.unwrap();
        sqlx::raw_sql("BEGIN; LOCK TABLE oncely_outbox_attempts IN SHARE ROW EXCLUSIVE MODE")
            .execute(&mut conn)
            .await
            .unwrap();
        self.enqueue(&mut conn, job).await.unwrap();
        Lock::Postgres(conn)
    }
}

impl Lock {
    /// Commits: the lock is free and the job visible.
    async fn release(self) {
        match self {
            Self::Sqlite(mut conn) => {
                sqlx::raw_sql("COMMIT").execute(&mut conn).await.unwrap();
            }
            Self::Postgres(mut conn) => {
                sqlx::raw_sql("COMMIT").execute(&mut conn).await.unwrap();
            }
        }
    }
}

both_stores!(a_claim_that_waited_shortens_the_send_never_the_lease);

/// Regression (issue 14, item 7): the handler's limit (90 % of the lease) started when the
/// claim returned, while the lease started when the database ran it; a claim that waited for a
/// lock let the lease run out mid-send, and a second worker took the job and ran it too. Here
/// two idle workers on a pool of one connection (so every claim runs on a connection that has
/// the claim prepared) poll while a lock holds their claims for half the lease; the job commits
/// with the lock's release, and its first attempt outlives the lease. It must be stopped before
/// its lease ends (recorded `unknown`, never `abandoned`), and never run twice at once.
async fn a_claim_that_waited_shortens_the_send_never_the_lease<S: Lockable>(_store: S, db: TestDb) {
    let store = S::fresh(&db, 1).await;
    let slow = Slow::default();
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..2 {
        let config = WorkerConfig {
            batch: 1,
            lease: LEASE,
            poll_interval: Duration::from_millis(100),
            ..WorkerConfig::default()
        };
        let policy = RetryPolicy {
            base: Duration::from_millis(10),
            max_delay: Duration::from_millis(10),
            ..RetryPolicy::DEFAULT
        };
        let (spy, mut claims) = Spy::watching(store.clone());
        let worker = Worker::new(spy, config).handle_with_policy("slow", slow.clone(), policy);
        workers.push(tokio::spawn(worker.run(shutdown.clone())));
        idle(&mut claims).await;
    }
    let lock = store
        .lock_with(&db, &NewJob::new("slow", "slow", serde_json::json!({})))
        .await;
    // The workers' next claims wait for the lock (wall-clock time: a lock is held).
    tokio::time::sleep(LOCKED_FOR).await;
    let released = Instant::now();
    lock.release().await;
    let sent = async {
        loop {
            let job = store.job("slow").await.unwrap().unwrap();
            if job.status != JobStatus::Pending {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let job = tokio::time::timeout(LEASE * 4, sent)
        .await
        .expect("the job settles");
    shutdown.cancel();
    for worker in workers {
        worker.await.unwrap().unwrap();
    }
    let first = slow.first_started.lock().unwrap().expect("it ran");
    assert!(first >= released, "the claim waited for the lock");
    assert_eq!(job.status, JobStatus::Sent);
    let results: Vec<String> = store
        .attempts(job.id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.result.unwrap_or_default())
        .collect();
    assert_eq!(
        results,
        ["unknown", "sent"],
        "the first attempt was stopped before its lease ended"
    );
    assert_eq!(slow.most.load(SeqCst), 1, "never two attempts at once");
}
