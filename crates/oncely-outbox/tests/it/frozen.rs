//! Issue 14, item 3: one key, one payload. A handler that freezes what it sends at the first
//! attempt ([`Handler::freeze`]) sends exactly that on every retry of the job's key, whatever
//! changed since; a provider that deduplicates by key (the inbox in provider mode, like Resend)
//! refuses another payload under a key it has seen.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncely_inbox::{Faults, Inbox};
use oncely_outbox::job::FreezeFuture;
use oncely_outbox::mail::Mailer;
use oncely_outbox::{
    Delivery, DeliveryFuture, Handler, Job, JobStatus, NewJob, RetryPolicy, Worker, WorkerConfig,
};
use oncely_testdb::TestDb;
use serde_json::json;

use crate::support::{Backend, both_stores, email_to, finished_attempts, mailer};

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
            let email = email_to(&to, &format!("Hello {to}"));
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
    setup_with(store, refuse, faults).await
}

/// [`setup`] with the provider's `faults`.
async fn setup_with<S: Backend>(
    store: &S,
    refuse: Option<Delivery>,
    faults: Faults,
) -> (Inbox, Worker<S>, Arc<Notify>) {
    let (inbox, running) = Inbox::start_local(faults).await.unwrap();
    let url = format!("http://{}/emails", running.http_addr);
    let handler = Arc::new(Notify {
        mailer: mailer(&url, Duration::from_millis(500)),
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

both_stores!(
    a_retry_sends_the_payload_frozen_at_the_first_attempt_whatever_changed_since,
    a_handler_can_end_an_attempt_from_freeze_without_running_it,
    a_payload_the_provider_refused_or_throttled_is_frozen_anew_at_the_next_attempt,
    a_payload_an_earlier_attempt_may_have_delivered_stays_frozen_through_a_throttle,
    a_refusal_that_kills_the_job_leaves_nothing_frozen_for_its_re_drive,
);

/// Second review of issue 14: a refusal that ended the job (it came after the horizon) left the
/// refused payload frozen, so the re-drive after the fix sent it again and was refused again.
async fn a_refusal_that_kills_the_job_leaves_nothing_frozen_for_its_re_drive<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let faults = Faults {
        unauthorized_next: 1,
        ..Faults::provider()
    };
    let (inbox, worker, handler) = setup_with(&store, None, faults).await;
    store.clock().advance(FAST.horizon + Duration::from_secs(1));
    worker.drain().await.unwrap(); // the first attempt, late: refused, and past the horizon
    let record = store.job("notify:1").await.unwrap().unwrap();
    assert_eq!(record.status, JobStatus::Dead, "{:?}", record.last_error);
    assert_eq!(record.frozen, None, "the provider stored nothing");
    *handler.current.lock().unwrap() = "fixed@example.com".into();
    assert!(store.redrive("notify:1").await.unwrap());
    store.clock().advance(PROBE); // the refusal paused the kind in this worker
    worker.drain().await.unwrap();
    let record = store.job("notify:1").await.unwrap().unwrap();
    assert_eq!(record.status, JobStatus::Sent, "{:?}", record.last_error);
    assert_eq!(inbox.messages(Some("fixed@example.com")).len(), 1);
}

/// `KindOptions::probe_interval`'s default: a paused kind's next probe.
const PROBE: Duration = Duration::from_secs(30);

/// Review of issue 14: a payload the provider refused (401/403: a sender domain not verified) or
/// throttled stayed frozen, so fixing the sender never reached the job — it was refused until
/// its horizon, and a re-drive kept the refused payload. A refused or throttled request stored
/// nothing under the key at the provider: the next attempt freezes what current state says.
async fn a_payload_the_provider_refused_or_throttled_is_frozen_anew_at_the_next_attempt<
    S: Backend,
>(
    store: S,
    _db: TestDb,
) {
    let faults = Faults {
        unauthorized_next: 1,
        throttle_next: 1,
        retry_after_s: 1,
        ..Faults::provider()
    };
    let (inbox, worker, handler) = setup_with(&store, None, faults).await;
    worker.drain().await.unwrap(); // refused: the kind pauses
    let record = store.job("notify:1").await.unwrap().unwrap();
    assert_eq!(finished_attempts(&store, record.id).await, ["paused"]);
    assert_eq!(record.frozen, None, "nothing reached the provider");
    *handler.current.lock().unwrap() = "fixed@example.com".into();
    store.clock().advance(PROBE);
    worker.drain().await.unwrap(); // the probe: throttled
    let record = store.job("notify:1").await.unwrap().unwrap();
    assert_eq!(
        finished_attempts(&store, record.id).await,
        ["paused", "throttled"]
    );
    assert_eq!(record.frozen, None);
    *handler.current.lock().unwrap() = "final@example.com".into();
    store
        .clock()
        .advance(FAST.max_delay.max(Duration::from_secs(1)));
    worker.drain().await.unwrap();
    let record = store.job("notify:1").await.unwrap().unwrap();
    assert_eq!(record.status, JobStatus::Sent, "{:?}", record.last_error);
    assert_eq!(record.frozen, Some(json!({ "to": "final@example.com" })));
    assert_eq!(inbox.messages(Some("final@example.com")).len(), 1);
    assert_eq!(inbox.messages(None).len(), 1);
    assert_eq!(handler.freezes.load(Ordering::SeqCst), 3);
}

/// What an attempt with an unknown outcome froze stays frozen through a later throttle: that
/// attempt may have reached the provider, which now holds the key with that payload.
async fn a_payload_an_earlier_attempt_may_have_delivered_stays_frozen_through_a_throttle<
    S: Backend,
>(
    store: S,
    _db: TestDb,
) {
    let (inbox, worker, handler) = setup(&store, None).await;
    worker.drain().await.unwrap(); // accepted, answer lost: unknown
    *handler.current.lock().unwrap() = "new@example.com".into();
    inbox.set_faults(Faults {
        throttle_next: 1,
        retry_after_s: 1,
        ..Faults::provider()
    });
    store.clock().advance(FAST.max_delay);
    worker.drain().await.unwrap(); // throttled
    store.clock().advance(Duration::from_secs(1));
    worker.drain().await.unwrap(); // deduplicated: the first payload
    let record = store.job("notify:1").await.unwrap().unwrap();
    assert_eq!(
        finished_attempts(&store, record.id).await,
        ["unknown", "throttled", "sent"]
    );
    assert_eq!(record.frozen, Some(json!({ "to": "old@example.com" })));
    assert_eq!(inbox.messages(None).len(), 1);
    assert_eq!(inbox.stats().mismatched, 0);
    assert_eq!(handler.freezes.load(Ordering::SeqCst), 1);
}

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
    assert_eq!(finished_attempts(&store, record.id).await, ["unknown"]);
    // The state the payload was made from changes before the retry.
    *handler.current.lock().unwrap() = "new@example.com".into();
    store.clock().advance(FAST.max_delay);
    worker.drain().await.unwrap();

    let record = store.job("notify:1").await.unwrap().unwrap();
    assert_eq!(
        (record.status, finished_attempts(&store, record.id).await),
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
    assert_eq!(record.status, JobStatus::Skipped);
    assert_eq!(record.last_error.as_deref(), Some("nobody to send to"));
    assert_eq!(finished_attempts(&store, record.id).await, ["skipped"]);
    assert_eq!(
        (record.frozen, handler.runs.load(Ordering::SeqCst)),
        (None, 0)
    );
    assert_eq!(inbox.stats().attempts, 0);
}
