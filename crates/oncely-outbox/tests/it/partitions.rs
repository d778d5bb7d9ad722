//! Issue 17: a kind's partitions (a webhook's endpoints) each run at most
//! [`KindOptions::per_partition`] jobs at once in a worker, and a partition at its limit — its
//! jobs blocked, as on an endpoint that times out — never keeps the kind's other partitions
//! waiting.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use oncely_outbox::store::JobFilter;
use oncely_outbox::{Delivery, Handler, Job, JobStatus, KindOptions, NewJob, Worker, WorkerConfig};
use oncely_testdb::TestDb;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::support::{Backend, Report, batch_of, both_stores};

both_stores!(
    a_partition_at_its_limit_never_keeps_the_kind_s_other_partitions_waiting,
    jobs_without_a_partition_have_only_the_kind_s_limits,
    a_kind_s_concurrency_above_the_batch_size_is_its_own,
);

/// Partition `a` has this many due jobs.
const BACKLOG: usize = 1000;

/// At most this many jobs of one partition at once.
const PER_PARTITION: u32 = 2;

/// Reports every job it starts; jobs of partition `a` wait for the gate. Counts how many of
/// `a` run at once, and the most that ever did.
struct Endpoints {
    started: mpsc::UnboundedSender<String>,
    gate: Arc<Semaphore>,
    running_a: AtomicU32,
    most_a: Arc<AtomicU32>,
}

impl Handler for Endpoints {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(async move {
            if job.partition.as_deref() == Some("a") {
                let now = self.running_a.fetch_add(1, Ordering::SeqCst) + 1;
                self.most_a.fetch_max(now, Ordering::SeqCst);
                let _ = self.started.send(job.operation_key.clone());
                let permit = self.gate.acquire().await;
                self.running_a.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
            } else {
                let _ = self.started.send(job.operation_key.clone());
            }
            Delivery::Sent {
                provider_message_id: None,
            }
        })
    }
}

/// The next job the handler starts (bounded: a blocked claim fails the test, not hangs it).
async fn next_started(started: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(10), started.recv())
        .await
        .expect("a job starts")
        .expect("the worker runs")
}

async fn a_partition_at_its_limit_never_keeps_the_kind_s_other_partitions_waiting<S: Backend>(
    store: S,
    _db: TestDb,
) {
    for i in 0..BACKLOG {
        let job = NewJob::new(format!("a:{i}"), "webhook", json!({})).partition("a");
        store.enqueue_with_business_row(job, true).await.unwrap();
    }
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let most_a = Arc::new(AtomicU32::new(0));
    let handler = Endpoints {
        started,
        gate: gate.clone(),
        running_a: AtomicU32::new(0),
        most_a: most_a.clone(),
    };
    let options = KindOptions {
        per_partition: Some(PER_PARTITION),
        ..KindOptions::default()
    };
    let config = WorkerConfig {
        batch: 16,
        poll_interval: Duration::from_secs(3600),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(store.clone(), config).handle_with("webhook", handler, options);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));

    // a's two slots fill; its other 998 due jobs wait, and the worker has 14 free.
    let mut first = vec![
        next_started(&mut started_rx).await,
        next_started(&mut started_rx).await,
    ];
    first.sort();
    assert_eq!(first, ["a:0", "a:1"], "a's oldest, up to its limit");

    // B's one job, enqueued after a's thousand, runs while a's slots are all busy.
    let b = NewJob::new("b:0", "webhook", json!({})).partition("b");
    store.enqueue_with_business_row(b, true).await.unwrap();
    assert_eq!(next_started(&mut started_rx).await, "b:0");
    let b_sent = async {
        loop {
            let b = store.job("b:0").await.unwrap().unwrap();
            if b.status == JobStatus::Sent {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), b_sent)
        .await
        .expect("b's job is sent while a's block");
    assert_eq!(most_a.load(Ordering::SeqCst), PER_PARTITION);
    assert!(started_rx.try_recv().is_err(), "nothing else started");

    // Open the gate: a's backlog drains, never more than its limit at once, claim after claim.
    gate.add_permits(BACKLOG);
    let drained = async {
        loop {
            let filter = JobFilter {
                status: Some(JobStatus::Pending),
                ..JobFilter::default()
            };
            if store.list(&filter).await.unwrap().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), drained)
        .await
        .expect("a's backlog drains");
    assert_eq!(
        most_a.load(Ordering::SeqCst),
        PER_PARTITION,
        "never more of a at once than its limit"
    );
    let mut claimed_a = 0;
    while let Ok(key) = started_rx.try_recv() {
        assert!(key.starts_with("a:"), "{key}");
        claimed_a += 1;
    }
    assert_eq!(claimed_a, BACKLOG - 2, "each of a's jobs ran once");
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

async fn jobs_without_a_partition_have_only_the_kind_s_limits<S: Backend>(store: S, _db: TestDb) {
    for i in 0..6 {
        let job = NewJob::new(format!("plain:{i}"), "webhook", json!({}));
        store.enqueue_with_business_row(job, true).await.unwrap();
    }
    for i in 0..3 {
        let job = NewJob::new(format!("p:{i}"), "webhook", json!({})).partition("p");
        store.enqueue_with_business_row(job, true).await.unwrap();
    }
    let (ran, mut ran_rx) = mpsc::unbounded_channel();
    let options = KindOptions {
        per_partition: Some(1),
        concurrency: Some(5),
        ..KindOptions::default()
    };
    let worker = Worker::new(store.clone(), WorkerConfig::default()).handle_with(
        "webhook",
        Report(ran),
        options,
    );
    // One round: the kind's concurrency (5) bounds the plain jobs; the partition gets its one.
    assert_eq!(worker.run_once().await.unwrap(), 5);
    let mut first = Vec::new();
    while let Ok(key) = ran_rx.try_recv() {
        first.push(key);
    }
    first.sort();
    assert_eq!(
        first,
        ["plain:0", "plain:1", "plain:2", "plain:3", "plain:4"]
    );
    assert_eq!(worker.run_once().await.unwrap(), 2, "plain:5 and p:0");
    assert_eq!(worker.drain().await.unwrap(), 2, "p:1, then p:2");
    assert_eq!(store.pending().await.unwrap(), 0);

    // A kind without the limit ignores partitions: one batch takes them all.
    for i in 0..3 {
        let job = NewJob::new(format!("q:{i}"), "plain", json!({})).partition("q");
        store.enqueue_with_business_row(job, true).await.unwrap();
    }
    let (ran, _ran_rx) = mpsc::unbounded_channel();
    let plain = Worker::new(store.clone(), WorkerConfig::default()).handle("plain", Report(ran));
    assert_eq!(plain.run_once().await.unwrap(), 3);
}

/// Regression (review of issue 17): a kind's concurrency was cut to the batch size (16), so
/// the webhook kind's 32 slots were 16, and eight endpoints hanging at 2 each filled them all.
/// A limited kind's slots are its own, however small the batch.
async fn a_kind_s_concurrency_above_the_batch_size_is_its_own<S: Backend>(store: S, _db: TestDb) {
    const ENDPOINTS: usize = 12;
    for i in 0..ENDPOINTS {
        for n in 0..3 {
            let job =
                NewJob::new(format!("{i}:{n}"), "webhook", json!({})).partition(format!("{i}"));
            store.enqueue_with_business_row(job, true).await.unwrap();
        }
    }
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let worker = Worker::new(store.clone(), batch_of(4)).handle_with(
        "webhook",
        Blocked {
            started,
            gate: gate.clone(),
        },
        KindOptions {
            concurrency: Some(24),
            per_partition: Some(2),
            ..KindOptions::default()
        },
    );
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // Every job blocks: 24 start (2 per endpoint), not 4.
    let mut first = Vec::new();
    for _ in 0..24 {
        first.push(next_started(&mut started_rx).await);
    }
    assert!(
        started_rx.try_recv().is_err(),
        "no more than the kind's 24 at once"
    );
    gate.add_permits(1_000);
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

/// Reports every job it starts, then waits for the gate.
struct Blocked {
    started: mpsc::UnboundedSender<String>,
    gate: Arc<Semaphore>,
}

impl Handler for Blocked {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(async move {
            let _ = self.started.send(job.operation_key.clone());
            let _permit = self.gate.acquire().await;
            Delivery::Sent {
                provider_message_id: None,
            }
        })
    }
}
