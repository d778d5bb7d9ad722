//! Issue 17: a job's follow-up jobs ([`Handler::then`]: an `email.sent` event for a sent email)
//! are written with its final status, in the same write, exactly once: never for a retry, never
//! when the worker's lease was lost, and a `then` that fails loses nothing.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncely_outbox::store::JobFilter;
use oncely_outbox::{
    AttemptResult, Delivery, Ended, Handler, Job, JobStatus, NewJob, ThenFuture, Worker,
    WorkerConfig,
};
use oncely_testdb::TestDb;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::support::{Backend, LEASE, Report, Spy, both_stores, idle, kinds};

both_stores!(
    follow_ups_come_once_with_each_final_status_and_never_with_a_retry,
    a_failing_then_leaves_the_job_pending_and_loses_nothing,
    a_then_that_fails_once_is_asked_again_and_the_job_runs_once,
    no_follow_ups_when_the_lease_was_lost,
    a_re_driven_job_gets_the_follow_ups_of_its_new_end,
    follow_ups_wake_the_workers_of_their_kind,
);

/// What a job's payload says to do: `"do"` is `sent`, `retry-then-sent`, `fail`, `skip` or
/// `block`. Its follow-up is `event:<key>:<status>`, of kind `event`, saying how it ended.
struct Email {
    runs: AtomicU32,
    /// `then` fails this many more times.
    then_failures: AtomicU32,
    /// What `then` was asked, in order.
    ends: Arc<Mutex<Vec<(String, Ended)>>>,
    /// `block` jobs wait for it.
    gate: Arc<Semaphore>,
}

impl Email {
    fn new() -> Self {
        Self {
            runs: AtomicU32::new(0),
            then_failures: AtomicU32::new(0),
            ends: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Handler for Email {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let sent = Delivery::Sent {
                provider_message_id: Some(format!("msg-{}", job.delivery_key)),
            };
            match job.payload["do"].as_str() {
                Some("retry-then-sent") if job.attempt == 1 => Delivery::Retry("503".into()),
                Some("fail") => Delivery::Permanent("550 no such mailbox".into()),
                Some("skip") => Delivery::Skipped("over the cap".into()),
                Some("block") => {
                    let _ = self.gate.acquire().await;
                    sent
                }
                _ => sent,
            }
        })
    }

    fn then<'a>(&'a self, job: &'a Job, end: &'a Ended) -> ThenFuture<'a> {
        self.ends
            .lock()
            .unwrap()
            .push((job.operation_key.clone(), end.clone()));
        let failing = self
            .then_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        Box::pin(async move {
            if failing {
                return Err("accounts database unreachable".into());
            }
            let status = end.status().as_str();
            let key = format!("event:{}:{status}", job.operation_key);
            Ok(vec![
                NewJob::new(key, "event", json!({ "status": status })).partition("ep-1"),
            ])
        })
    }
}

fn email(key: &str, what: &str) -> NewJob {
    NewJob::new(key, "email", json!({ "do": what }))
}

/// The operation keys of the `event` jobs, sorted.
async fn events<S: Backend>(store: &S) -> Vec<String> {
    let filter = JobFilter {
        kind: Some("event".into()),
        limit: 1000,
        ..JobFilter::default()
    };
    let mut keys: Vec<String> = store
        .list(&filter)
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.operation_key)
        .collect();
    keys.sort();
    keys
}

async fn follow_ups_come_once_with_each_final_status_and_never_with_a_retry<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let handler = Email::new();
    let ends = handler.ends.clone();
    let worker = Worker::new(store.clone(), WorkerConfig::default()).handle("email", handler);
    for (key, what) in [
        ("sent", "sent"),
        ("retried", "retry-then-sent"),
        ("failed", "fail"),
        ("skipped", "skip"),
    ] {
        store
            .enqueue_with_business_row(email(key, what), true)
            .await
            .unwrap();
    }
    let past = store.clock().now() - Duration::from_secs(1);
    let expired = email("expired", "sent").not_after(past);
    store
        .enqueue_with_business_row(expired, true)
        .await
        .unwrap();

    assert_eq!(worker.drain().await.unwrap(), 5);
    assert_eq!(
        events(&store).await,
        [
            "event:expired:dead",
            "event:failed:dead",
            "event:sent:sent",
            "event:skipped:skipped"
        ],
        "none for the retry"
    );
    let retried = store.job("retried").await.unwrap().unwrap();
    assert_eq!(retried.status, JobStatus::Pending);

    // The retry comes due and is sent: its follow-up comes with it.
    store.clock().advance(Duration::from_secs(3600));
    assert_eq!(worker.drain().await.unwrap(), 1);
    let events_now = events(&store).await;
    assert_eq!(events_now.len(), 5);
    assert!(events_now.contains(&"event:retried:sent".to_owned()));
    let follow_up = store.job("event:retried:sent").await.unwrap().unwrap();
    assert_eq!(follow_up.status, JobStatus::Pending, "enqueued, due");
    assert_eq!(follow_up.partition.as_deref(), Some("ep-1"));
    assert_eq!(follow_up.payload, json!({"status": "sent"}));

    // `then` heard each end once, with what it was.
    let ends = ends.lock().unwrap().clone();
    assert_eq!(ends.len(), 5, "{ends:?}");
    let end_of = |key: &str| ends.iter().find(|(k, _)| k == key).unwrap().1.clone();
    let sent = store.job("sent").await.unwrap().unwrap();
    assert_eq!(
        end_of("sent"),
        Ended::Sent {
            provider_message_id: Some(format!("msg-{}", sent.delivery_key))
        }
    );
    assert_eq!(
        end_of("failed"),
        Ended::Dead {
            result: AttemptResult::Dead,
            reason: "550 no such mailbox".into()
        }
    );
    assert!(matches!(
        end_of("expired"),
        Ended::Dead {
            result: AttemptResult::Expired,
            ..
        }
    ));
    assert_eq!(
        end_of("skipped"),
        Ended::Skipped {
            reason: "over the cap".into()
        }
    );
}

/// A `then` that fails until the lease's last 5 % (asked again meanwhile): the job is not
/// recorded as ended without its follow-ups. (A 2 s lease: the worker asks for that long.)
async fn a_failing_then_leaves_the_job_pending_and_loses_nothing<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let handler = Arc::new(Email::new());
    handler.then_failures.store(u32::MAX, Ordering::SeqCst);
    let config = WorkerConfig {
        lease: Duration::from_secs(2),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(store.clone(), config).handle("email", Shared(handler.clone()));
    store
        .enqueue_with_business_row(email("k", "sent"), true)
        .await
        .unwrap();
    let before = store.job("k").await.unwrap().unwrap();
    assert_eq!(worker.drain().await.unwrap(), 1);

    // Not recorded as sent without its follow-up: pending, a free `unknown` attempt.
    let job = store.job("k").await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Pending);
    assert_eq!(
        (job.attempts, job.free_attempts),
        (1, 1),
        "no attempt spent"
    );
    assert!(
        job.last_error
            .as_deref()
            .is_some_and(|e| e.contains("accounts database unreachable")),
        "{:?}",
        job.last_error
    );
    let attempts = store.attempts(job.id).await.unwrap();
    assert_eq!(attempts[0].result.as_deref(), Some("unknown"));
    assert!(events(&store).await.is_empty());
    let asked = handler.ends.lock().unwrap().len();
    assert!(
        asked > 3,
        "`then` was asked again before giving up: {asked}"
    );

    // Retried soon (the policy's first delay: at most 2 s), under the same key.
    handler.then_failures.store(0, Ordering::SeqCst);
    store.clock().advance(Duration::from_secs(2));
    assert_eq!(worker.drain().await.unwrap(), 1);
    let job = store.job("k").await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Sent);
    assert_eq!(job.delivery_key, before.delivery_key);
    assert_eq!(events(&store).await, ["event:k:sent"]);
}

/// Review of issue 20 (F3): a `then` that failed once (its first statement met a connection
/// the database server had ended) left the job pending, and its retry sent the email again
/// over plain SMTP. It is asked again at once: one run, one final status, one follow-up.
async fn a_then_that_fails_once_is_asked_again_and_the_job_runs_once<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let handler = Arc::new(Email::new());
    handler.then_failures.store(1, Ordering::SeqCst);
    let worker = Worker::new(store.clone(), WorkerConfig::default())
        .handle("email", Shared(handler.clone()));
    store
        .enqueue_with_business_row(email("k", "sent"), true)
        .await
        .unwrap();
    assert_eq!(worker.drain().await.unwrap(), 1);
    let job = store.job("k").await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Sent);
    assert_eq!((job.attempts, job.free_attempts), (1, 0));
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1, "sent once");
    assert_eq!(handler.ends.lock().unwrap().len(), 2, "`then` asked twice");
    assert_eq!(events(&store).await, ["event:k:sent"]);
}

async fn no_follow_ups_when_the_lease_was_lost<S: Backend>(store: S, _db: TestDb) {
    let handler = Email::new();
    let gate = handler.gate.clone();
    let runs = Arc::new(handler);
    let worker =
        Worker::new(store.clone(), WorkerConfig::default()).handle("email", Shared(runs.clone()));
    store
        .enqueue_with_business_row(email("k", "block"), true)
        .await
        .unwrap();
    let first = tokio::spawn(async move { worker.run_once().await });
    let started = async {
        while runs.runs.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), started)
        .await
        .expect("the first worker runs it");
    // Its lease ends (the store's time) and another worker takes the job.
    store.clock().advance(LEASE + Duration::from_secs(1));
    let other = store
        .claim("other", &kinds(&["email"]), 1, LEASE)
        .await
        .unwrap();
    assert_eq!(other.len(), 1);
    // The first worker's handler ends: sent, but its finish and follow-ups are fenced out.
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert!(events(&store).await.is_empty(), "no follow-up");
    let job = store.job("k").await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Pending, "the other worker's claim");
}

/// A handler shared with the test.
struct Shared(Arc<Email>);

impl Handler for Shared {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        self.0.run(job)
    }
    fn then<'a>(&'a self, job: &'a Job, end: &'a Ended) -> ThenFuture<'a> {
        self.0.then(job, end)
    }
}

/// Fails for good on the first run, sent on every later one.
struct DiesThenSent(AtomicU32);

impl Handler for DiesThenSent {
    fn run<'a>(&'a self, _job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        let first = self.0.fetch_add(1, Ordering::SeqCst) == 0;
        Box::pin(async move {
            if first {
                Delivery::Permanent("550".into())
            } else {
                Delivery::Sent {
                    provider_message_id: None,
                }
            }
        })
    }
    fn then<'a>(&'a self, job: &'a Job, end: &'a Ended) -> ThenFuture<'a> {
        let key = format!("event:{}:{}", job.operation_key, end.status().as_str());
        Box::pin(async move { Ok(vec![NewJob::new(key, "event", json!({}))]) })
    }
}

async fn a_re_driven_job_gets_the_follow_ups_of_its_new_end<S: Backend>(store: S, _db: TestDb) {
    let worker = Worker::new(store.clone(), WorkerConfig::default())
        .handle("email", DiesThenSent(AtomicU32::new(0)));
    store
        .enqueue_with_business_row(email("k", "sent"), true)
        .await
        .unwrap();
    assert_eq!(worker.drain().await.unwrap(), 1);
    assert_eq!(events(&store).await, ["event:k:dead"]);
    assert!(store.redrive("k").await.unwrap());
    assert_eq!(worker.drain().await.unwrap(), 1);
    assert_eq!(events(&store).await, ["event:k:dead", "event:k:sent"]);
}

async fn follow_ups_wake_the_workers_of_their_kind<S: Backend>(store: S, _db: TestDb) {
    // An idle worker of `event` that polls once an hour.
    let (spy, mut claims) = Spy::watching(store.clone());
    let (ran, mut ran_rx) = mpsc::unbounded_channel();
    let config = WorkerConfig {
        poll_interval: Duration::from_secs(3600),
        ..WorkerConfig::default()
    };
    let events_worker = Worker::new(spy, config).handle("event", Report(ran));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(events_worker.run(shutdown.clone()));
    idle(&mut claims).await;

    let emails = Worker::new(store.clone(), WorkerConfig::default()).handle("email", Email::new());
    store
        .enqueue_with_business_row(email("k", "sent"), true)
        .await
        .unwrap();
    assert_eq!(emails.drain().await.unwrap(), 1);
    let ran = tokio::time::timeout(Duration::from_secs(10), ran_rx.recv())
        .await
        .expect("woken well before its hourly poll");
    assert_eq!(ran.as_deref(), Some("event:k:sent"));
    shutdown.cancel();
    running.await.unwrap().unwrap();
}
