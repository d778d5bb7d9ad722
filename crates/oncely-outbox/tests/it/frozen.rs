//! Issue 14, item 3: one key, one payload. A handler that freezes what it sends at the first
//! attempt ([`Handler::freeze`]) sends exactly that on every retry of the job's key, whatever
//! changed since; a provider that deduplicates by key (the inbox in provider mode, like Resend)
//! refuses another payload under a key it has seen.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncely_inbox::{Faults, Inbox};
use oncely_outbox::job::FreezeFuture;
use oncely_outbox::mail::{Email, Mailer, from_url};
use oncely_outbox::{
    Delivery, DeliveryFuture, Handler, Job, JobStatus, NewJob, RetryPolicy, Worker, WorkerConfig,
};
use oncely_testdb::TestDb;
use serde_json::json;

use crate::support::{Backend, both_stores};

const FAST: RetryPolicy = RetryPolicy {
    base: Duration::from_millis(10),
    max_delay: Duration::from_millis(40),
    max_attempts: 6,
    horizon: Duration::from_secs(3600),
};

/// Sends an email to the address `current` holds when the job is first attempted: it freezes
/// the recipient, and sends to the frozen one (to the current one if nothing is frozen).
struct Notify {
    mailer: Arc<dyn Mailer>,
    current: Arc<Mutex<String>>,
    /// `freeze` ends the attempt with this outcome instead, if set.
    refuse: Option<Delivery>,
    freezes: AtomicUsize,
    runs: AtomicUsize,
}

impl Handler for Notify {
    fn freeze<'a>(&'a self, _job: &'a Job) -> FreezeFuture<'a> {
        self.freezes.fetch_add(1, Ordering::SeqCst);
        let answer = match &self.refuse {
            Some(outcome) => Err(outcome.clone()),
            None => Ok(Some(json!({ "to": *self.current.lock().unwrap() }))),
        };
        Box::pin(std::future::ready(answer))
    }

    fn run<'a>(&'a self, job: &'a Job) -> DeliveryFuture<'a> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            // As sent before issue 14 when nothing is frozen: from the state of the moment.
            let to = match job.frozen.as_ref().and_then(|f| f["to"].as_str()) {
                Some(to) => to.to_owned(),
                None => self.current.lock().unwrap().clone(),
            };
            let email = Email {
                from: "oncely@localhost".into(),
                to: to.clone(),
                subject: "Hello".into(),
                text: format!("Hello {to}"),
            };
            self.mailer
                .send(&email, &job.delivery_key.to_string())
                .await
        })
    }
}

/// A provider-mode inbox that loses its first answer, a worker sending to it over the HTTP API
/// with [`Notify`] for kind `notify`, and the handler (to change its state and count its calls).
async fn setup<S: Backend>(store: &S, refuse: Option<Delivery>) -> (Inbox, Worker<S>, Arc<Notify>) {
    let faults = Faults {
        drop_after_accept: 1,
        ..Faults::provider()
    };
    let (inbox, running) = Inbox::start_local(faults).await.unwrap();
    let url = format!("http://{}/emails", running.http_addr);
    let handler = Arc::new(Notify {
        mailer: from_url(&url, None, Duration::from_millis(500), None).unwrap(),
        current: Arc::new(Mutex::new("old@example.com".into())),
        refuse,
        freezes: AtomicUsize::new(0),
        runs: AtomicUsize::new(0),
    });
    let worker = Worker::new(store.clone(), WorkerConfig::default()).handle_with_policy(
        "notify",
        Shared(handler.clone()),
        FAST,
    );
    let job = NewJob::new("notify:1", "notify", json!({ "user": 1 }));
    store.enqueue_with_business_row(job, true).await.unwrap();
    (inbox, worker, handler)
}

/// The handler, shared with the test.
struct Shared(Arc<Notify>);

impl Handler for Shared {
    fn freeze<'a>(&'a self, job: &'a Job) -> FreezeFuture<'a> {
        self.0.freeze(job)
    }
    fn run<'a>(&'a self, job: &'a Job) -> DeliveryFuture<'a> {
        self.0.run(job)
    }
}

async fn results<S: Backend>(store: &S, id: i64) -> Vec<String> {
    let attempts = store.attempts(id).await.unwrap();
    attempts.into_iter().filter_map(|a| a.result).collect()
}

both_stores!(
    a_retry_sends_the_payload_frozen_at_the_first_attempt_whatever_changed_since,
    a_handler_can_end_an_attempt_from_freeze_without_running_it,
);

async fn a_retry_sends_the_payload_frozen_at_the_first_attempt_whatever_changed_since<
    S: Backend,
>(
    store: S,
    _db: TestDb,
) {
    let (inbox, worker, handler) = setup(&store, None).await;
    // The first attempt: accepted, the answer lost (unknown); the retry waits for its delay.
    worker.drain().await.unwrap();
    let record = store.job("notify:1").await.unwrap().unwrap();
    assert_eq!(record.frozen, Some(json!({ "to": "old@example.com" })));
    assert_eq!(results(&store, record.id).await, ["unknown"]);
    // The state the payload was made from changes before the retry.
    *handler.current.lock().unwrap() = "new@example.com".into();
    store.clock().advance(FAST.max_delay);
    worker.drain().await.unwrap();

    let record = store.job("notify:1").await.unwrap().unwrap();
    assert_eq!(
        (record.status, results(&store, record.id).await),
        (JobStatus::Sent, vec!["unknown".into(), "sent".into()]),
        "{:?}",
        record.last_error
    );
    assert_eq!(inbox.messages(Some("old@example.com")).len(), 1);
    assert!(inbox.messages(Some("new@example.com")).is_empty());
    let stats = inbox.stats();
    assert_eq!((stats.deduplicated, stats.mismatched), (1, 0));
    assert_eq!(handler.freezes.load(Ordering::SeqCst), 1, "frozen once");
    assert_eq!(handler.runs.load(Ordering::SeqCst), 2);
}

async fn a_handler_can_end_an_attempt_from_freeze_without_running_it<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let skip = Delivery::Skipped("nobody to send to".into());
    let (inbox, worker, handler) = setup(&store, Some(skip)).await;
    worker.drain().await.unwrap();
    let record = store.job("notify:1").await.unwrap().unwrap();
    assert_eq!(record.status, JobStatus::Dead);
    assert_eq!(record.last_error.as_deref(), Some("nobody to send to"));
    assert_eq!(results(&store, record.id).await, ["skipped"]);
    assert_eq!(
        (record.frozen, handler.runs.load(Ordering::SeqCst)),
        (None, 0)
    );
    assert_eq!(inbox.stats().attempts, 0);
}
