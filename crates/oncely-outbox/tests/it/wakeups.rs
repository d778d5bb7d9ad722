//! Wake-ups: an idle worker learns of a job when its transaction commits, with no call after
//! the commit. PostgreSQL: a NOTIFY inside the enqueuing transaction (delivered at commit), at
//! most one notifying enqueue per window, a trailing NOTIFY for the others. SQLite: a signal
//! inside the transaction; the woken worker's claim waits for the commit.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use oncely_outbox::store::CHANNEL;
use oncely_outbox::store::postgres::{
    LISTEN_CONNECT_TIMEOUT, LISTENER_APPLICATION_NAME, PgJobStore,
};
use oncely_outbox::store::sqlite::SqliteJobStore;
use oncely_outbox::{Delivery, Handler, Job, JobStore, NewJob, Worker, WorkerConfig};
use oncely_testdb::{TestDb, TestPostgres};
use sqlx::postgres::PgListener;
use sqlx::{Sqlite, Transaction};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::support::{Backend, Claim, Fresh, Report, Spy, both_stores, idle};

async fn postgres() -> (PgJobStore, TestPostgres) {
    let (store, db) = crate::support::postgres().await;
    let TestDb::Postgres(db) = db else {
        unreachable!()
    };
    (store, *db)
}

/// The payload of a NOTIFY for `ping` jobs: the kinds it announces.
const PING: &str = r#"["ping"]"#;

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
    assert_eq!(next(&mut listener).await, PING, "the first enqueue's");
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
    assert_eq!(next(&mut listener).await, PING, "the first enqueue's");
    assert_eq!(next(&mut listener).await, "marker");
    assert_eq!(next(&mut listener).await, PING, "the trailing NOTIFY");
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
        Self::start_for(store, "ping").await
    }

    /// [`Hourly::start`], running jobs of `kind`.
    async fn start_for<S: Backend>(store: S, kind: &str) -> Self {
        let (spy, mut claims) = Spy::watching(store);
        let (ran, ran_rx) = mpsc::unbounded_channel();
        let config = WorkerConfig {
            poll_interval: Duration::from_secs(3600),
            ..WorkerConfig::default()
        };
        let worker = Worker::new(spy, config).handle(kind, Report(ran));
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

    /// Stops it; returns what it saw of its claims since the test last read them.
    async fn stop(self) -> mpsc::UnboundedReceiver<Claim> {
        self.shutdown.cancel();
        self.running.await.unwrap().unwrap();
        self.claims
    }
}

/// How many claims began among those `claims` reported.
fn claims_started(claims: &mut mpsc::UnboundedReceiver<Claim>) -> usize {
    std::iter::from_fn(|| claims.try_recv().ok())
        .filter(|claim| *claim == Claim::Started)
        .count()
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

both_stores!(
    two_workers_on_a_pool_of_two_leave_it_to_enqueues_and_claims,
    a_worker_is_woken_only_for_the_kinds_it_runs,
);

/// Regression (issue 14, item 6): each worker held a pool connection for its LISTEN forever, so
/// two workers on a pool of two (`--workers 2 --database-pool 2`) left none for their claims or
/// for the enqueue. The store's one listener has a connection of its own.
async fn two_workers_on_a_pool_of_two_leave_it_to_enqueues_and_claims<S: Fresh>(
    _store: S,
    db: TestDb,
) {
    let store = S::fresh(&db, 2).await;
    let mut one = Hourly::start(store.clone()).await;
    let mut two = Hourly::start(store.clone()).await;
    tokio::time::timeout(
        Duration::from_secs(10),
        store.enqueue_with_business_row(ping("pool-of-two"), true),
    )
    .await
    .expect("the pool has a connection for the enqueue")
    .unwrap();
    let ran = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::select! {
            key = one.ran.recv() => key,
            key = two.ran.recv() => key,
        }
    })
    .await
    .expect("woken well before the one-hour poll");
    assert_eq!(ran.as_deref(), Some("pool-of-two"));
    one.stop().await;
    two.stop().await;
}

/// Regression (issue 14, item 6): every NOTIFY (every enqueue, on SQLite) woke every worker,
/// whatever kinds it ran: each cost a claim that found nothing. A worker of `ping` sees twenty
/// jobs of another kind committed (spaced, so that each could wake it), then one of its own.
async fn a_worker_is_woken_only_for_the_kinds_it_runs<S: Backend>(store: S, _db: TestDb) {
    let mut worker = Hourly::start(store.clone()).await;
    for i in 0..20 {
        let other = NewJob::new(format!("other-{i}"), "other", serde_json::json!({}));
        store.enqueue_with_business_row(other, true).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store
        .enqueue_with_business_row(ping("mine"), true)
        .await
        .unwrap();
    assert_eq!(started(&mut worker.ran).await, "mine");
    let mut claims = worker.stop().await;
    // The claim that found `mine`; on PostgreSQL maybe one more for the trailing NOTIFY of its
    // window, and one when the listener began to listen (it wakes everyone then).
    let claims = claims_started(&mut claims);
    assert!(
        (1..=3).contains(&claims),
        "{claims} claims: woken for jobs of another kind"
    );
}

/// The listener's backends (by `application_name`) on the test database.
async fn listeners(store: &PgJobStore) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = $1",
    )
    .bind(LISTENER_APPLICATION_NAME)
    .fetch_all(store.pool())
    .await
    .unwrap()
}

/// Waits until one listener other than `old` is connected (at most a failed attempt to connect
/// and a little more); returns its pid.
async fn listening(store: &PgJobStore, old: Option<i32>) -> i32 {
    let new = async {
        loop {
            let pids = listeners(store).await;
            if let [pid] = pids[..]
                && Some(pid) != old
            {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(LISTEN_CONNECT_TIMEOUT * 3, new)
        .await
        .expect("a listener connects")
}

/// Issue 14, item 6: the workers of a store (and its clones) share one listener, on a
/// connection that is not the pool's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_workers_of_a_store_share_one_listener_outside_its_pool() {
    let (store, _db) = postgres().await;
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(Hourly::start(store.clone()).await);
    }
    listening(&store, None).await;
    assert_eq!(listeners(&store).await.len(), 1, "one listener");
    store
        .enqueue_with_business_row(ping("shared"), true)
        .await
        .unwrap();
    let (ran, _, _) = tokio::time::timeout(
        Duration::from_secs(20),
        futures::future::select_all(workers.iter_mut().map(|w| Box::pin(w.ran.recv()))),
    )
    .await
    .expect("woken well before the one-hour poll");
    assert_eq!(ran.as_deref(), Some("shared"));
    for worker in workers {
        worker.stop().await;
    }
}

/// Runs `ping` jobs, reporting each; holds `slow` until the gate opens.
struct Gated {
    ran: mpsc::UnboundedSender<String>,
    gate: Arc<Semaphore>,
}

impl Handler for Gated {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        let _ = self.ran.send(job.operation_key.clone());
        Box::pin(async move {
            if job.operation_key == "slow" {
                let _ = self.gate.acquire().await;
            }
            Delivery::Sent {
                provider_message_id: None,
            }
        })
    }
}

/// Regression (issue 14, item 6): a busy worker never read its LISTEN socket; the NOTIFYs piled
/// up (pinning PostgreSQL's notification queue), and once free it ran one claim per NOTIFY it
/// read. The listener reads them as they come, and a busy worker's wake-ups collapse into one.
/// Here the worker's only slot is busy while 5,000 NOTIFYs of its kind arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_listener_drains_while_the_workers_are_busy_and_their_wakeups_collapse() {
    let (store, _db) = postgres().await;
    // Every enqueue notifies in its transaction: one NOTIFY each, no trailing ones to count.
    let store = store.notify_window(Duration::ZERO);
    let (spy, mut claims) = Spy::watching(store.clone());
    let (ran, mut started_keys) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let config = WorkerConfig {
        batch: 1,
        poll_interval: Duration::from_secs(3600),
        ..WorkerConfig::default()
    };
    let gated = Gated {
        ran,
        gate: gate.clone(),
    };
    let worker = Worker::new(spy, config).handle("ping", gated);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    idle(&mut claims).await;
    store
        .enqueue_with_business_row(ping("slow"), true)
        .await
        .unwrap();
    assert_eq!(
        started(&mut started_keys).await,
        "slow",
        "its one slot is busy"
    );
    // Distinct payloads, each naming its kind: PostgreSQL folds equal ones of a transaction.
    sqlx::query(
        "SELECT pg_notify($1, json_build_array('ping', 'n' || i)::text)
           FROM generate_series(1, 5000) AS i",
    )
    .bind(CHANNEL)
    .execute(store.pool())
    .await
    .unwrap();
    // Sent after them: once a worker of `other` runs this job, the listener read all 5,000.
    let mut other = Hourly::start_for(store.clone(), "other").await;
    store
        .enqueue_with_business_row(NewJob::new("other", "other", serde_json::json!({})), true)
        .await
        .unwrap();
    assert_eq!(started(&mut other.ran).await, "other");
    assert!(
        started_keys.try_recv().is_err(),
        "the ping worker is still busy"
    );
    claims_started(&mut claims);
    gate.add_permits(1);
    store
        .enqueue_with_business_row(ping("last"), true)
        .await
        .unwrap();
    assert_eq!(started(&mut started_keys).await, "last");
    // Room for a backlog to show: a worker that read its NOTIFYs only now would claim once for
    // each (thousands); this one makes a few claims, then waits.
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    running.await.unwrap().unwrap();
    other.stop().await;
    let claims = claims_started(&mut claims);
    assert!(
        claims <= 4,
        "{claims} claims after the worker was free: its wake-ups did not collapse"
    );
}

/// Issue 14, item 6: a listener that cannot connect logs and retries, the workers poll
/// meanwhile (the job still runs), and once it connects again it listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listener_that_cannot_connect_leaves_the_workers_polling_until_it_can() {
    let (_store, db) = postgres().await;
    let pool = db.pool(4).await;
    // Four connections open now, for the claims and the enqueue; any new one fails, the
    // listener's first (it connects with the pool's options, read at each attempt).
    let open: Vec<_> = futures::future::try_join_all((0..4).map(|_| pool.acquire()))
        .await
        .unwrap();
    drop(open);
    let good = (*pool.connect_options()).clone();
    pool.set_connect_options(good.clone().port(1));
    let store = PgJobStore::new(pool.clone());
    let (ran, mut started_keys) = mpsc::unbounded_channel();
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(200),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(store.clone(), config).handle("ping", Report(ran));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    store
        .enqueue_with_business_row(ping("polled"), true)
        .await
        .unwrap();
    assert_eq!(started(&mut started_keys).await, "polled");
    assert!(listeners(&store).await.is_empty(), "nobody listens");
    pool.set_connect_options(good);
    listening(&store, None).await;
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

/// Issue 14, item 6: a listener whose connection breaks connects again and wakes the workers
/// (what was announced in between is lost, so they look).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broken_listener_connects_again() {
    let (store, _db) = postgres().await;
    let mut worker = Hourly::start(store.clone()).await;
    let first = listening(&store, None).await;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(first)
        .execute(store.pool())
        .await
        .unwrap();
    store
        .enqueue_with_business_row(ping("after-the-break"), true)
        .await
        .unwrap();
    assert_eq!(started(&mut worker.ran).await, "after-the-break");
    listening(&store, Some(first)).await;
    worker.stop().await;
}
