//! Wake-ups: an idle worker learns of a job when its transaction commits, with no call after
//! the commit. PostgreSQL: a NOTIFY inside the enqueuing transaction (delivered at commit), at
//! most one notifying enqueue per window, a trailing NOTIFY for the others. SQLite: a signal
//! inside the transaction; the woken worker's claim waits for the commit.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use oncely_outbox::store::CHANNEL;
use oncely_outbox::store::postgres::PgJobStore;
use oncely_outbox::store::sqlite::SqliteJobStore;
use oncely_outbox::{Delivery, Handler, Job, JobStore, NewJob, Worker, WorkerConfig};
use oncely_testdb::{TestDb, TestPostgres};
use sqlx::postgres::PgListener;
use sqlx::{Sqlite, Transaction};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::{Backend, Claim, Spy, both_stores, idle};

async fn postgres() -> (PgJobStore, TestPostgres) {
    let (store, db) = crate::support::postgres().await;
    let TestDb::Postgres(db) = db else {
        unreachable!()
    };
    (store, *db)
}

fn ping(key: &str) -> NewJob {
    NewJob::new(key, "ping", serde_json::json!({}))
}

async fn listen(db: &TestPostgres) -> PgListener {
    let mut listener = PgListener::connect(db.url()).await.unwrap();
    listener.listen(CHANNEL).await.unwrap();
    listener
}

/// The next notification's payload.
async fn next(listener: &mut PgListener) -> String {
    let notification = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("a notification arrives")
        .unwrap();
    notification.payload().to_owned()
}

async fn marker(store: &PgJobStore) {
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(CHANNEL)
        .execute(store.pool())
        .await
        .unwrap();
}

/// Listens, commits an enqueue of each of `keys` through a store with `window`, then sends a
/// marker NOTIFY. The store goes when this returns: what it owes is sent all the same.
async fn enqueues_then_marker(window: Duration, keys: &[&str]) -> (PgListener, TestPostgres) {
    let (store, db) = postgres().await;
    let store = store.notify_window(window);
    let listener = listen(&db).await;
    for key in keys {
        store
            .enqueue_with_business_row(ping(key), true)
            .await
            .unwrap();
    }
    marker(&store).await;
    (listener, db)
}

/// Regression (issue 12): `enqueue` ran `pg_notify` in every caller's transaction, so every
/// committing enqueuer queued behind PostgreSQL's global notify lock. Now only the first of a
/// burst notifies in its transaction. Notifications arrive in commit order: after the first
/// enqueue's, the next one a listener sees is the marker sent after the last commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_enqueues_notifies_inside_one_transaction_only() {
    let keys = ["burst-1", "burst-2", "burst-3"];
    let (mut listener, _db) = enqueues_then_marker(Duration::from_secs(3600), &keys).await;
    assert_eq!(next(&mut listener).await, "", "the first enqueue's");
    assert_eq!(next(&mut listener).await, "marker");
}

/// A NOTIFY inside a transaction that rolls back is never delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_enqueue_notifies_nothing() {
    let (store, db) = postgres().await;
    let mut listener = listen(&db).await;
    store
        .enqueue_with_business_row(ping("rolled-back"), false)
        .await
        .unwrap();
    marker(&store).await;
    assert_eq!(next(&mut listener).await, "marker");
}

/// An enqueue inside the window skips its own NOTIFY; the trailing one comes a window later,
/// from outside any transaction (so after the marker sent right after its commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_inside_the_window_gets_a_trailing_notify() {
    let keys = ["first", "inside-the-window"];
    let (mut listener, _db) = enqueues_then_marker(Duration::from_secs(2), &keys).await;
    assert_eq!(next(&mut listener).await, "", "the first enqueue's");
    assert_eq!(next(&mut listener).await, "marker");
    assert_eq!(next(&mut listener).await, "", "the trailing NOTIFY");
}

/// Tells the test which job ran.
struct Report(mpsc::UnboundedSender<String>);

impl Handler for Report {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        let _ = self.0.send(job.operation_key.clone());
        Box::pin(async {
            Delivery::Sent {
                provider_message_id: None,
            }
        })
    }
}

/// A worker that polls once an hour, reporting each job it runs.
struct Hourly {
    ran: mpsc::UnboundedReceiver<String>,
    claims: mpsc::UnboundedReceiver<Claim>,
    shutdown: CancellationToken,
    running: tokio::task::JoinHandle<Result<(), oncely_outbox::OutboxError>>,
}

impl Hourly {
    /// Started on `store`, and idle (its first claim found nothing) when this returns.
    async fn start<S: Backend>(store: S) -> Self {
        let (spy, mut claims) = Spy::watching(store);
        let (ran, ran_rx) = mpsc::unbounded_channel();
        let config = WorkerConfig {
            poll_interval: Duration::from_secs(3600),
            ..WorkerConfig::default()
        };
        let worker = Worker::new(spy, config).handle("ping", Report(ran));
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(worker.run(shutdown.clone()));
        idle(&mut claims).await;
        Self {
            ran: ran_rx,
            claims,
            shutdown,
            running,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.running.await.unwrap().unwrap();
    }
}

async fn started(ran: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(20), ran.recv())
        .await
        .expect("woken well before the one-hour poll")
        .unwrap()
}

/// A worker on another store instance (its own pool and LISTEN connection, as in another
/// process) with a one-hour poll interval starts each job once it is committed — the second
/// inside the first's window, so by the trailing NOTIFY. Nobody calls `wake`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_reaches_a_worker_of_another_store_instance() {
    let (store, db) = postgres().await;
    let other = PgJobStore::new(db.pool(4).await);
    let mut worker = Hourly::start(other).await;
    for key in ["ping-1", "ping-2"] {
        store
            .enqueue_with_business_row(ping(key), true)
            .await
            .unwrap();
        assert_eq!(started(&mut worker.ran).await, key);
    }
    worker.stop().await;
    assert_eq!(store.pending().await.unwrap(), 0);
}

/// A job inserted by other means than `enqueue` reaches idle workers by `wake` after its
/// commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wake_reaches_workers_for_jobs_inserted_by_other_means() {
    let (store, db) = postgres().await;
    let other = PgJobStore::new(db.pool(4).await);
    let mut worker = Hourly::start(other).await;
    sqlx::query(
        "INSERT INTO oncely_outbox (operation_key, kind, payload, delivery_key)
         VALUES ('by-hand', 'ping', '{}', gen_random_uuid())",
    )
    .execute(store.pool())
    .await
    .unwrap();
    store.wake();
    assert_eq!(started(&mut worker.ran).await, "by-hand");
    worker.stop().await;
}

/// SQLite: an idle worker, and an open transaction that wrote a business row and enqueued
/// `key`, which woke the worker at once: its claim has begun (and waits for the transaction's
/// write lock).
async fn sqlite_woken_inside_a_transaction(
    key: &str,
) -> (SqliteJobStore, TestDb, Hourly, Transaction<'static, Sqlite>) {
    let (store, db) = crate::support::sqlite().await;
    let mut worker = Hourly::start(store.clone()).await;
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO business (note) VALUES ($1)")
        .bind(key)
        .execute(&mut *tx)
        .await
        .unwrap();
    store.enqueue(&mut tx, &ping(key)).await.unwrap();
    assert_eq!(
        worker.claims.recv().await,
        Some(Claim::Started),
        "woken at once"
    );
    (store, db, worker, tx)
}

/// SQLite: the enqueue signals the worker inside the transaction; its claim waits for the
/// transaction's write lock, so it runs the job right after the commit — never before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_wakes_the_worker_inside_the_transaction_and_its_claim_waits_for_the_commit() {
    let (_store, _db, mut worker, tx) = sqlite_woken_inside_a_transaction("signal").await;
    assert!(
        worker.ran.try_recv().is_err(),
        "nothing runs before the commit"
    );
    tx.commit().await.unwrap();
    assert_eq!(started(&mut worker.ran).await, "signal");
    worker.stop().await;
}

/// SQLite: after a rollback the woken worker's claim finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_rolled_back_enqueue_costs_the_woken_worker_an_empty_claim() {
    let (store, _db, mut worker, tx) = sqlite_woken_inside_a_transaction("never").await;
    tx.rollback().await.unwrap();
    assert_eq!(worker.claims.recv().await, Some(Claim::Returned(0)));
    assert!(worker.ran.try_recv().is_err());
    assert!(store.job("never").await.unwrap().is_none());
    worker.stop().await;
}

both_stores!(a_job_committed_while_the_worker_claims_is_not_missed);

/// Regression: on SQLite the signal woke only workers already waiting, so a job committed
/// while the idle worker was between its claim and its wait slept until the next poll. Here
/// the job commits inside the worker's first claim, after it looked.
async fn a_job_committed_while_the_worker_claims_is_not_missed<S: Backend>(store: S, _db: TestDb) {
    let spy = Spy::new(store);
    *spy.enqueue_after_claim.lock().unwrap() = Some(ping("during-the-claim"));
    // Its first claim found nothing, then the job committed before the claim returned.
    let mut worker = Hourly::start(spy).await;
    assert_eq!(started(&mut worker.ran).await, "during-the-claim");
    worker.stop().await;
}
