//! PostgreSQL wake-ups: enqueue does not NOTIFY inside the business transaction (that takes the
//! global notify lock at commit); `wake` after the commit reaches workers in other processes.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use oncely_outbox::store::CHANNEL;
use oncely_outbox::store::postgres::PgJobStore;
use oncely_outbox::{Delivery, Handler, Job, JobStore, NewJob, Worker, WorkerConfig};
use oncely_testdb::{TestDb, TestPostgres};
use sqlx::postgres::PgListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::Backend;

async fn postgres() -> (PgJobStore, TestPostgres) {
    let (store, db) = crate::support::postgres().await;
    let TestDb::Postgres(db) = db else {
        unreachable!()
    };
    (store, *db)
}

/// Regression: `enqueue` ran `pg_notify` in the caller's transaction, so every committing
/// enqueuer queued behind PostgreSQL's global notify lock. Notifications arrive in commit
/// order: the first one a listener sees after an enqueue committed is the marker sent after
/// it, not one from the enqueue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_does_not_notify_inside_the_transaction() {
    let (store, db) = postgres().await;
    let mut listener = PgListener::connect(db.url()).await.unwrap();
    listener.listen(CHANNEL).await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    oncely_outbox::store::postgres::enqueue(
        &mut tx,
        &NewJob::new("quiet", "email", serde_json::json!({})),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(CHANNEL)
        .execute(store.pool())
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("the marker arrives")
        .unwrap();
    assert_eq!(first.payload(), "marker");
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

/// A worker on another store instance (its own pool and LISTEN connection, as in another
/// process) with a one-hour poll interval starts a job once it is committed and woken: only the
/// NOTIFY can explain it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wake_after_commit_reaches_a_worker_of_another_store_instance() {
    let (store, db) = postgres().await;
    let other = PgJobStore::new(db.pool(4).await);
    let (ran, mut ran_rx) = mpsc::unbounded_channel();
    let config = WorkerConfig {
        poll_interval: Duration::from_secs(3600),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(other, config).handle("ping", Report(ran));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // The worker's first claim finds nothing; then it waits on LISTEN.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for key in ["ping-1", "ping-2"] {
        // enqueue_with_business_row commits, then calls `store.wake()`.
        store
            .enqueue_with_business_row(NewJob::new(key, "ping", serde_json::json!({})), true)
            .await
            .unwrap();
        let started = tokio::time::timeout(Duration::from_secs(20), ran_rx.recv())
            .await
            .expect("woken well before the one-hour poll")
            .unwrap();
        assert_eq!(started, key);
    }
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(store.pending().await.unwrap(), 0);
}
