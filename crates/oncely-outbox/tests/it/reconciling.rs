//! Issue 21, item 1, the automatic half: a worker settles the parked jobs of a kind that
//! reconciles by asking its provider ([`Handler::reconcile`]): accepted → settled as sent (never
//! run again), not accepted → resent under the same key (but only once the job has been parked
//! for a lease), cannot say → asked again later, less and less often. An operator's settlement
//! wins over a look; a look that outlived its lease changes nothing.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncely_outbox::{
    Delivery, Ended, Handler, Job, JobStatus, KindOptions, NewJob, OnUnknown, ReconcileFuture,
    Reconciled, Reconciliation, Settlement, ThenFuture, Worker, WorkerConfig,
};
use oncely_testdb::TestDb;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{
    Backend, LEASE, Runs, both_stores, email_to, job_in, kinds, mailer, results, status,
};

/// How long a "no" waits to be believed: the kinds' default grace.
const GRACE: Duration = KindOptions::DEFAULT_RECONCILE_GRACE;

both_stores!(
    a_parked_job_the_provider_accepted_is_settled_as_sent_and_never_run_again,
    a_no_is_believed_only_after_the_grace_then_the_job_is_resent_under_its_key,
    a_provider_that_cannot_say_is_asked_again_less_and_less_often,
    a_lookup_that_panics_or_hangs_is_a_provider_that_cannot_say,
    an_operator_s_settlement_or_a_later_look_wins_over_a_look,
    a_kind_that_cannot_ask_or_resends_is_not_looked_at,
    a_running_worker_settles_parked_jobs_by_itself,
    a_running_worker_looks_again_at_once_after_a_full_batch,
    over_smtp_a_dropped_answer_is_settled_by_the_inbox_s_lookup_with_one_copy,
    a_slow_answer_is_not_taken_for_a_no_and_a_broken_lookup_says_nothing,
);

/// The first run of a job is an unknown outcome; every later one is sent. A lookup answers what
/// the payload's `"look"` says (`accepted`, `not`, `unknown`, `panic`, `hang`), and every look
/// is counted.
#[derive(Clone, Default)]
struct Provider {
    runs: Runs,
    looks: Arc<Mutex<HashMap<String, usize>>>,
    /// Whether it says it can ask its provider (`true` unless set).
    cannot_ask: bool,
}

impl Provider {
    fn runs_of(&self, key: &str) -> Vec<Uuid> {
        self.runs.of(key)
    }

    fn looks_at(&self, key: &str) -> usize {
        self.looks.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

impl Handler for Provider {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        let first = self.runs.record(job) == 1;
        Box::pin(async move {
            if first {
                Delivery::Unknown("the answer to DATA was lost".into())
            } else {
                Delivery::Sent {
                    provider_message_id: Some("resent-1".into()),
                }
            }
        })
    }

    fn then<'a>(&'a self, job: &'a Job, end: &'a Ended) -> ThenFuture<'a> {
        let follow_ups = match end {
            Ended::Sent { .. } => vec![NewJob::new(
                format!("event:{}", job.operation_key),
                "event",
                json!({}),
            )],
            _ => Vec::new(),
        };
        Box::pin(async move { Ok(follow_ups) })
    }

    fn reconciles(&self) -> bool {
        !self.cannot_ask
    }

    fn reconcile<'a>(&'a self, job: &'a Job) -> ReconcileFuture<'a> {
        *self
            .looks
            .lock()
            .unwrap()
            .entry(job.operation_key.clone())
            .or_default() += 1;
        let look = job.payload["look"].as_str().unwrap_or("unknown").to_owned();
        Box::pin(async move {
            match look.as_str() {
                "accepted" => Reconciled::Accepted {
                    provider_message_id: Some("accepted-1".into()),
                },
                "not" => Reconciled::NotAccepted,
                "panic" => panic!("the lookup's client broke"),
                "hang" => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Reconciled::NotAccepted
                }
                _ => Reconciled::Unknown("the lookup API answered 502".into()),
            }
        })
    }
}

fn reconciling() -> KindOptions {
    KindOptions {
        on_unknown: OnUnknown::Reconcile,
        ..KindOptions::default()
    }
}

fn worker<S: Backend>(store: &S, provider: &Provider) -> Worker<S> {
    worker_with(store, provider, WorkerConfig::default())
}

fn worker_with<S: Backend>(store: &S, provider: &Provider, config: WorkerConfig) -> Worker<S> {
    Worker::new(store.clone(), config).handle_with("r", provider.clone(), reconciling())
}

/// Enqueues `key` (kind `r`) whose lookup answers `look`, and runs it once: it parks.
async fn parked<S: Backend>(store: &S, worker: &Worker<S>, key: &str, look: &str) -> i64 {
    let job = NewJob::new(key, "r", json!({ "look": look }));
    store.enqueue_with_business_row(job, true).await.unwrap();
    worker.drain().await.unwrap();
    job_in(store, key, JobStatus::Unknown).await.id
}

/// Waits (10 s at the most) until the inbox has taken the message under the delivery key `key`
/// (a delay fault holds it) and decides on no other copy.
async fn taken(inbox: &oncely_inbox::Inbox, key: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let deciding = |d: oncely_inbox::Delivery| d.deciding || d.copies == 0;
    while deciding(inbox.delivery(key)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn a_parked_job_the_provider_accepted_is_settled_as_sent_and_never_run_again<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let provider = Provider::default();
    let worker = worker(&store, &provider);
    let id = parked(&store, &worker, "r:1", "accepted").await;
    // Not before its first look is due (the policy's first delay).
    assert_eq!(
        worker.reconcile_once().await.unwrap(),
        Reconciliation::default()
    );
    store.clock().advance(Duration::from_secs(3));
    let done = worker.reconcile_once().await.unwrap();
    assert_eq!((done.looked, done.sent, done.resend), (1, 1, 0), "{done:?}");
    assert_eq!(
        status(&store, "r:1").await,
        JobStatus::Pending,
        "settled: due"
    );
    assert_eq!(worker.drain().await.unwrap(), 1);
    let record = job_in(&store, "r:1", JobStatus::Sent).await;
    assert_eq!(
        record.provider_message_id.as_deref(),
        Some("accepted-1"),
        "the provider's id from the lookup"
    );
    assert_eq!(provider.runs_of("r:1").len(), 1, "never sent again");
    assert!(store.job("event:r:1").await.unwrap().is_some());
    assert_eq!(
        results(&store, id).await,
        ["unknown", "sent"],
        "the settled attempt recorded without a run"
    );
    // Nothing parked is left to look at.
    store.clock().advance(Duration::from_secs(3600));
    assert_eq!(worker.reconcile_once().await.unwrap().looked, 0);
    assert_eq!(provider.looks_at("r:1"), 1);
}

async fn a_no_is_believed_only_after_the_grace_then_the_job_is_resent_under_its_key<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let provider = Provider::default();
    let worker = worker(&store, &provider);
    parked(&store, &worker, "r:1", "not").await;
    store.clock().advance(Duration::from_secs(3));
    let done = worker.reconcile_once().await.unwrap();
    assert_eq!(
        (done.looked, done.resend, done.later),
        (1, 0, 1),
        "a no within the grace of the parking is not believed yet: {done:?}"
    );
    assert_eq!(status(&store, "r:1").await, JobStatus::Unknown);
    // Asked again only once the grace has passed since it parked.
    store.clock().advance(GRACE - Duration::from_secs(5));
    assert_eq!(worker.reconcile_once().await.unwrap().looked, 0);
    assert_eq!(worker.drain().await.unwrap(), 0, "still parked: not run");
    store.clock().advance(Duration::from_secs(3));
    let done = worker.reconcile_once().await.unwrap();
    assert_eq!((done.looked, done.resend), (1, 1), "{done:?}");
    let record = store.job("r:1").await.unwrap().unwrap();
    assert_eq!(record.status, JobStatus::Pending);
    assert_eq!(record.attempts, 0, "a fresh budget, as a re-drive");
    assert_eq!(worker.drain().await.unwrap(), 1);
    assert_eq!(status(&store, "r:1").await, JobStatus::Sent);
    let keys = provider.runs_of("r:1");
    assert_eq!(keys.len(), 2, "resent once");
    assert_eq!(keys[0], keys[1], "under the same delivery key");
    assert_eq!(provider.looks_at("r:1"), 2);
}

async fn a_provider_that_cannot_say_is_asked_again_less_and_less_often<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let provider = Provider::default();
    let worker = worker(&store, &provider);
    parked(&store, &worker, "r:1", "unknown").await;
    let mut gaps = Vec::new();
    let mut elapsed = Duration::ZERO;
    for _ in 0..6 {
        // Step the clock until the next look happens.
        let mut waited = Duration::ZERO;
        loop {
            store.clock().advance(Duration::from_secs(1));
            waited += Duration::from_secs(1);
            let done = worker.reconcile_once().await.unwrap();
            if done.looked == 1 {
                assert_eq!(done.later, 1, "{done:?}");
                break;
            }
            assert!(waited < Duration::from_secs(7200), "never looked again");
        }
        elapsed += waited;
        gaps.push(waited);
    }
    assert_eq!(provider.looks_at("r:1"), 6);
    assert_eq!(status(&store, "r:1").await, JobStatus::Unknown);
    assert_eq!(provider.runs_of("r:1").len(), 1, "never resent blindly");
    // Each gap is as long as the job had been parked (from the policy's 2 s base): they grow.
    assert!(gaps.windows(2).all(|w| w[1] >= w[0]), "{gaps:?}");
    assert!(
        gaps[5] >= Duration::from_secs(16),
        "the sixth look comes after it had been parked for tens of seconds: {gaps:?} ({elapsed:?})"
    );
}

async fn a_lookup_that_panics_or_hangs_is_a_provider_that_cannot_say<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let provider = Provider::default();
    // A short lease: a look may take 90 % of it.
    let config = WorkerConfig {
        lease: Duration::from_millis(400),
        ..WorkerConfig::default()
    };
    let worker = worker_with(&store, &provider, config);
    parked(&store, &worker, "r:panics", "panic").await;
    parked(&store, &worker, "r:hangs", "hang").await;
    parked(&store, &worker, "r:accepted", "accepted").await;
    store.clock().advance(Duration::from_secs(3));
    let started = std::time::Instant::now();
    let done = worker.reconcile_once().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a hung lookup is cut off"
    );
    assert_eq!(
        (done.looked, done.sent, done.later),
        (3, 1, 2),
        "the others are settled regardless: {done:?}"
    );
    assert_eq!(status(&store, "r:panics").await, JobStatus::Unknown);
    assert_eq!(status(&store, "r:hangs").await, JobStatus::Unknown);
    assert_eq!(status(&store, "r:accepted").await, JobStatus::Pending);
}

async fn an_operator_s_settlement_or_a_later_look_wins_over_a_look<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let provider = Provider::default();
    let worker = worker(&store, &provider);
    let id = parked(&store, &worker, "r:1", "accepted").await;
    store.clock().advance(Duration::from_secs(3));
    let looked = store.claim_parked(&kinds(&["r"]), 10, LEASE).await.unwrap();
    assert_eq!(looked.len(), 1);
    assert_eq!(looked[0].job.id, id);
    // While the look holds it, another look does not take it.
    assert!(
        store
            .claim_parked(&kinds(&["r"]), 10, LEASE)
            .await
            .unwrap()
            .is_empty()
    );
    // The operator settles it meanwhile: the look's answer changes nothing.
    // Not parked long enough for a resend: the settlement itself refuses (the store's clock).
    assert!(
        !store
            .settle_looked(&looked[0], Settlement::Resend, None, Some(GRACE))
            .await
            .unwrap()
    );
    assert_eq!(status(&store, "r:1").await, JobStatus::Unknown);
    assert!(store.settle(id, Settlement::Resend).await.unwrap());
    assert!(
        !store
            .settle_looked(&looked[0], Settlement::Sent, Some("x"), None)
            .await
            .unwrap()
    );
    assert!(
        !store
            .look_later(&looked[0], Duration::from_secs(60))
            .await
            .unwrap()
    );
    let record = store.job("r:1").await.unwrap().unwrap();
    assert_eq!(record.status, JobStatus::Pending);
    assert_eq!(record.provider_message_id, None);

    // Parked again; a look takes it and outlives its lease; a later look takes it over.
    let other = parked(&store, &worker, "r:2", "accepted").await;
    store.clock().advance(Duration::from_secs(3));
    let stale = store.claim_parked(&kinds(&["r"]), 10, LEASE).await.unwrap();
    assert_eq!(stale.len(), 1);
    assert_eq!(stale[0].job.id, other);
    store.clock().advance(LEASE + Duration::from_secs(1));
    let fresh = store.claim_parked(&kinds(&["r"]), 10, LEASE).await.unwrap();
    assert_eq!(fresh.len(), 1, "due again when the look's lease ended");
    assert!(
        !store
            .settle_looked(&stale[0], Settlement::Resend, None, None)
            .await
            .unwrap(),
        "the stale look changes nothing"
    );
    assert!(
        store
            .settle_looked(&fresh[0], Settlement::Sent, Some("accepted-2"), None)
            .await
            .unwrap()
    );
    assert_eq!(status(&store, "r:2").await, JobStatus::Pending);
    // Only parked jobs of the kinds asked for are taken.
    assert!(
        store
            .claim_parked(&kinds(&["other"]), 10, LEASE)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_kind_that_cannot_ask_or_resends_is_not_looked_at<S: Backend>(store: S, _db: TestDb) {
    let cannot = Provider {
        cannot_ask: true,
        ..Provider::default()
    };
    let worker = worker(&store, &cannot);
    parked(&store, &worker, "r:1", "accepted").await;
    let before = store.job("r:1").await.unwrap().unwrap().run_after;
    store.clock().advance(Duration::from_secs(3600));
    assert_eq!(
        worker.reconcile_once().await.unwrap(),
        Reconciliation::default()
    );
    assert_eq!(cannot.looks_at("r:1"), 0);
    let record = store.job("r:1").await.unwrap().unwrap();
    assert_eq!(
        record.status,
        JobStatus::Unknown,
        "it waits for an operator"
    );
    assert_eq!(record.run_after, before);
    // A kind that resends has nothing parked, and is never looked at either.
    let asks = Provider::default();
    let resends = Worker::new(store.clone(), WorkerConfig::default()).handle_with(
        "r",
        asks.clone(),
        KindOptions::default(),
    );
    assert_eq!(
        resends.reconcile_once().await.unwrap(),
        Reconciliation::default()
    );
    assert_eq!(asks.looks_at("r:1"), 0);
}

async fn a_running_worker_settles_parked_jobs_by_itself<S: Backend>(store: S, _db: TestDb) {
    let provider = Provider::default();
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(50),
        ..WorkerConfig::default()
    };
    let worker = worker_with(&store, &provider, config);
    parked(&store, &worker, "r:1", "accepted").await;
    store.clock().advance(Duration::from_secs(3));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while status(&store, "r:1").await != JobStatus::Sent {
        assert!(
            std::time::Instant::now() < deadline,
            "the running worker never settled and recorded it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(provider.runs_of("r:1").len(), 1);
    assert_eq!(provider.looks_at("r:1"), 1);
}

async fn a_running_worker_looks_again_at_once_after_a_full_batch<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let provider = Provider::default();
    // Batches of 2, and a poll interval of an hour: only looking again at once after a full
    // batch settles all five in time.
    let config = WorkerConfig {
        batch: 2,
        poll_interval: Duration::from_secs(3600),
        ..WorkerConfig::default()
    };
    let worker = worker_with(&store, &provider, config);
    for n in 0..5 {
        parked(&store, &worker, &format!("r:{n}"), "accepted").await;
    }
    store.clock().advance(Duration::from_secs(3));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let parked = store.backlog().await.unwrap().parked;
        if parked == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{parked} still parked: the reconciler waited a poll interval after a full batch"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

/// An email kind over SMTP to the test inbox that reconciles by asking the inbox's lookup
/// (`template`, `{key}` for the delivery key), each send bounded by `timeout`.
fn email_worker<S: Backend>(
    store: &S,
    running: &oncely_inbox::Running,
    template: &str,
    timeout: Duration,
) -> Worker<S> {
    let smtp = mailer(&format!("smtp://{}", running.smtp_addr), timeout);
    let mailer =
        oncely_outbox::mail::LookedUp::new(smtp, template, Duration::from_secs(2)).unwrap();
    Worker::new(store.clone(), WorkerConfig::default()).handle_with(
        "email",
        oncely_outbox::mail::EmailHandler::new(Arc::new(mailer)),
        reconciling(),
    )
}

async fn enqueue_email<S: Backend>(store: &S, key: &str, to: &str) {
    let email = email_to(to, &format!("job {key}"));
    let job = NewJob::new(key, "email", serde_json::to_value(email).unwrap());
    store.enqueue_with_business_row(job, true).await.unwrap();
}

/// A test inbox with `faults` and an email worker to it (each send bounded by `timeout`) that
/// reconciles by asking the inbox's lookup.
async fn looking_up<S: Backend>(
    store: &S,
    faults: oncely_inbox::Faults,
    timeout: Duration,
) -> (oncely_inbox::Inbox, oncely_inbox::Running, Worker<S>) {
    let (inbox, running) = oncely_inbox::Inbox::start_local(faults).await.unwrap();
    let lookup = format!("http://{}/deliveries/{{key}}", running.http_addr);
    let worker = email_worker(store, &running, &lookup, timeout);
    (inbox, running, worker)
}

/// An email job `key` to `to`, run by `worker`: parked, its outcome unknown.
async fn email_parked<S: Backend>(store: &S, worker: &Worker<S>, key: &str, to: &str) {
    enqueue_email(store, key, to).await;
    worker.drain().await.unwrap();
    assert_eq!(status(store, key).await, JobStatus::Unknown);
}

async fn over_smtp_a_dropped_answer_is_settled_by_the_inbox_s_lookup_with_one_copy<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let faults = oncely_inbox::Faults {
        drop_after_accept: 1,
        ..oncely_inbox::Faults::default()
    };
    let (inbox, _, worker) = looking_up(&store, faults, Duration::from_secs(2)).await;
    email_parked(&store, &worker, "mail:1", "ada@example.com").await;
    assert_eq!(
        inbox.messages(None).len(),
        1,
        "accepted, the answer dropped"
    );
    store.clock().advance(Duration::from_secs(3));
    let done = worker.reconcile_once().await.unwrap();
    assert_eq!((done.looked, done.sent), (1, 1), "{done:?}");
    worker.drain().await.unwrap();
    let record = job_in(&store, "mail:1", JobStatus::Sent).await;
    assert_eq!(
        record.provider_message_id,
        Some(inbox.messages(None)[0].id.clone()),
        "the inbox's id of the copy it accepted"
    );
    assert_eq!(inbox.messages(None).len(), 1, "never sent again");
}

async fn a_slow_answer_is_not_taken_for_a_no_and_a_broken_lookup_says_nothing<S: Backend>(
    store: S,
    _db: TestDb,
) {
    // The inbox takes 1.5 s to take a message; the mailer gives up after 300 ms: the attempt's
    // outcome is unknown while the inbox is still taking the message.
    let faults = oncely_inbox::Faults {
        delay_ms: 1500,
        ..oncely_inbox::Faults::default()
    };
    let (inbox, running, worker) = looking_up(&store, faults, Duration::from_millis(300)).await;
    email_parked(&store, &worker, "mail:slow", "ada@example.com").await;
    assert!(inbox.messages(None).is_empty(), "not taken yet");
    // Asked at once, the inbox has not taken it: a "no" that is not believed yet.
    store.clock().advance(Duration::from_secs(3));
    let done = worker.reconcile_once().await.unwrap();
    assert_eq!(
        (done.looked, done.resend, done.later),
        (1, 0, 1),
        "{done:?}"
    );
    // Meanwhile the inbox takes it; asked again once the lease has passed: accepted.
    let job = store.job("mail:slow").await.unwrap().unwrap();
    taken(&inbox, &job.delivery_key.to_string()).await;
    assert_eq!(inbox.messages(None).len(), 1);
    store.clock().advance(GRACE);
    let done = worker.reconcile_once().await.unwrap();
    assert_eq!((done.looked, done.sent), (1, 1), "{done:?}");
    worker.drain().await.unwrap();
    assert_eq!(status(&store, "mail:slow").await, JobStatus::Sent);
    assert_eq!(
        inbox.messages(None).len(),
        1,
        "one copy: a slow answer is no loss"
    );

    // A lookup that answers 404 (a wrong path) or cannot be reached says nothing: the job stays
    // parked, asked again later.
    inbox.set_faults(oncely_inbox::Faults {
        drop_after_accept: 2,
        ..oncely_inbox::Faults::default()
    });
    for (key, template) in [
        (
            "mail:404",
            format!("http://{}/no-such/{{key}}", running.http_addr),
        ),
        (
            "mail:down",
            "http://127.0.0.1:9/deliveries/{key}".to_owned(),
        ),
    ] {
        let worker = email_worker(&store, &running, &template, Duration::from_secs(2));
        email_parked(&store, &worker, key, "bob@example.com").await;
        store.clock().advance(GRACE * 2);
        let done = worker.reconcile_once().await.unwrap();
        // (The first job again too: asked again once its delay passed.)
        assert!(done.looked >= 1, "{key}: {done:?}");
        assert_eq!(done.later, done.looked, "{key}: {done:?}");
        assert_eq!(status(&store, key).await, JobStatus::Unknown, "{key}");
    }
}

/// The test inbox's lookup, asked through [`oncely_outbox::mail::LookedUp`]: a message being
/// decided (a delay fault holds it) is no "no"; nor is a "no" for a key the inbox may have
/// forgotten (a reset after the job was enqueued); a "no" for a job enqueued after the reset is.
#[tokio::test]
async fn the_inbox_lookup_says_no_only_when_it_can_know() {
    use oncely_outbox::mail::Mailer;
    let faults = oncely_inbox::Faults {
        delay_ms: 1500,
        ..oncely_inbox::Faults::default()
    };
    let (inbox, running) = oncely_inbox::Inbox::start_local(faults).await.unwrap();
    let smtp = mailer(
        &format!("smtp://{}", running.smtp_addr),
        Duration::from_millis(300),
    );
    let lookup = format!("http://{}/deliveries/{{key}}", running.http_addr);
    let mailer = oncely_outbox::mail::LookedUp::new(smtp, &lookup, Duration::from_secs(2)).unwrap();
    let enqueued = time::OffsetDateTime::now_utc();
    let email = email_to("ada@example.com", "hi");
    let key = Uuid::new_v4().to_string();
    let sent = mailer.send(&email, &key).await;
    assert!(matches!(sent, Delivery::Unknown(_)), "{sent:?}");
    let deciding = mailer.look_up(&key, enqueued).await;
    assert!(
        matches!(&deciding, Reconciled::Unknown(why) if why.contains("deciding")),
        "{deciding:?}"
    );
    // Once the inbox has taken it: accepted.
    taken(&inbox, &key).await;
    assert!(matches!(
        mailer.look_up(&key, enqueued).await,
        Reconciled::Accepted { .. }
    ));

    // A reset forgets every key: a job enqueued before it gets no "no".
    inbox.clear();
    let forgotten = mailer.look_up(&key, enqueued).await;
    assert!(
        matches!(&forgotten, Reconciled::Unknown(why) if why.contains("forgotten")),
        "{forgotten:?}"
    );
    let later = time::OffsetDateTime::now_utc() + Duration::from_millis(10);
    assert_eq!(
        mailer.look_up(&Uuid::new_v4().to_string(), later).await,
        Reconciled::NotAccepted
    );
}
