//! Workers delivering email to the test inbox, over real SMTP and HTTP, under injected faults.

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncely_inbox::{Faults, Inbox, Rejection, Running};
use oncely_outbox::mail::{EmailHandler, IdempotencyHeader, Mailer, from_url};
use oncely_outbox::{JobRecord, JobStatus, JobStore, NewJob, RetryPolicy, Worker, WorkerConfig};
use oncely_testdb::TestDb;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::support::{Backend, Spy, batch_of, both_stores, email_to, idle, mailer, results};

const FAST: RetryPolicy = RetryPolicy {
    base: Duration::from_millis(10),
    max_delay: Duration::from_millis(40),
    max_attempts: 6,
    horizon: Duration::from_secs(3600),
};

async fn inbox(faults: Faults) -> (Inbox, Running) {
    Inbox::start_local(faults).await.unwrap()
}

fn smtp(running: &Running) -> Arc<dyn Mailer> {
    smtp_with_header(running, None)
}

/// An SMTP mailer sending the delivery key in `header` (`None`: the default).
fn smtp_with_header(running: &Running, header: Option<&str>) -> Arc<dyn Mailer> {
    from_url(
        &format!("smtp://{}", running.smtp_addr),
        None,
        Duration::from_secs(2),
        header.map(|h| IdempotencyHeader::new(h).unwrap()),
    )
    .unwrap()
}

fn http(running: &Running, timeout: Duration) -> Arc<dyn Mailer> {
    mailer(&format!("http://{}/emails", running.http_addr), timeout)
}

fn worker<S: Backend>(store: &S, mailer: Arc<dyn Mailer>, policy: RetryPolicy) -> Worker<S> {
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(50),
        ..WorkerConfig::default()
    };
    Worker::new(store.clone(), config).handle_with_policy(
        "email",
        EmailHandler::new(mailer),
        policy,
    )
}

fn email_job(key: &str, to: &str) -> NewJob {
    let email = email_to(to, &format!("job {key}"));
    NewJob::new(key, "email", serde_json::to_value(email).unwrap())
}

/// Runs the worker until the job leaves `pending`, or 10 s; between rounds the store's clock
/// moves past the longest retry delay, so each retry is due at once.
async fn run_until_settled<S: Backend>(
    worker: &Worker<S>,
    store: &S,
    key: &str,
) -> oncely_outbox::JobRecord {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        worker.drain().await.unwrap();
        let record = store.job(key).await.unwrap().unwrap();
        if record.status != JobStatus::Pending || Instant::now() > deadline {
            return record;
        }
        store.clock().advance(FAST.max_delay);
    }
}

/// How the worker sends.
enum Via {
    Smtp,
    /// The inbox's HTTP API, with this timeout.
    Http(Duration),
}

/// The inbox rejects the next `n` attempts with `rejection`.
fn rejecting(n: u32, rejection: Rejection) -> Faults {
    Faults {
        reject_next: n,
        rejection,
        ..Faults::default()
    }
}

/// `faults`, and the first accepted message's answer is lost (the outcome is unknown).
fn losing_the_first_answer(faults: Faults) -> Faults {
    Faults {
        drop_after_accept: 1,
        ..faults
    }
}

/// Starts an inbox with `faults`, enqueues `job` (key `k`) and runs a worker sending it over
/// SMTP under [`FAST`] until the job settles.
async fn settle<S: Backend>(
    store: &S,
    faults: Faults,
    job: NewJob,
) -> (Inbox, oncely_outbox::JobRecord) {
    settle_with(store, faults, job, Via::Smtp, FAST).await
}

/// [`settle`], sending `via` and under `policy`.
async fn settle_with<S: Backend>(
    store: &S,
    faults: Faults,
    job: NewJob,
    via: Via,
    policy: RetryPolicy,
) -> (Inbox, oncely_outbox::JobRecord) {
    let (inbox, running) = inbox(faults).await;
    store.enqueue_with_business_row(job, true).await.unwrap();
    let mailer = match via {
        Via::Smtp => smtp(&running),
        Via::Http(timeout) => http(&running, timeout),
    };
    let record = run_until_settled(&worker(store, mailer, policy), store, "k").await;
    (inbox, record)
}

/// Enqueues (and commits) `job`.
async fn enqueue<S: Backend>(store: &S, job: NewJob) {
    store.enqueue_with_business_row(job, true).await.unwrap();
}

/// A job of `kind` with an empty payload.
fn plain(key: impl Into<String>, kind: &str) -> NewJob {
    NewJob::new(key, kind, serde_json::json!({}))
}

/// How many emails reached `to` once one did (at most 5 s).
async fn first_emails_to(inbox: &Inbox, to: &str) -> usize {
    inbox.wait_for(to, 1, Duration::from_secs(5)).await.len()
}

/// Cancels `shutdown` and expects `worker` to return cleanly within 5 s (`why` if not).
async fn stop(
    shutdown: &CancellationToken,
    worker: tokio::task::JoinHandle<Result<(), oncely_outbox::OutboxError>>,
    why: &str,
) {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), worker)
        .await
        .expect(why)
        .unwrap()
        .unwrap();
}

both_stores!(
    a_job_is_delivered_once_over_smtp_with_its_delivery_key,
    three_temporary_rejections_then_delivered_on_the_fourth_attempt,
    a_permanent_rejection_is_dead_at_once_with_its_reason,
    attempts_stop_at_the_maximum_and_the_job_is_dead,
    accept_then_drop_with_a_deduplicating_provider_delivers_exactly_one_email,
    a_provider_that_does_not_read_the_mailer_s_header_delivers_the_resend_again,
    accept_then_drop_over_plain_smtp_records_the_duplicate,
    the_http_provider_gets_the_same_idempotency_key_on_every_retry,
    a_job_past_its_deadline_is_not_sent,
    an_idle_worker_wakes_when_a_job_commits_and_stops_on_shutdown,
    four_workers_deliver_a_hundred_jobs_exactly_once,
    a_stuck_job_holds_its_own_slot_and_never_the_next_claim,
);

async fn a_job_is_delivered_once_over_smtp_with_its_delivery_key<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let (inbox, record) =
        settle(&store, Faults::default(), email_job("k", "ada@example.com")).await;
    assert_eq!(record.status, JobStatus::Sent);
    let messages = inbox.messages(Some("ada@example.com"));
    assert_eq!(messages.len(), 1);
    let key = record.delivery_key.to_string();
    assert_eq!(messages[0].idempotency_key.as_deref(), Some(key.as_str()));
    assert_eq!(
        messages[0].message_id.as_deref(),
        Some(format!("{key}@oncely").as_str())
    );
    assert_eq!(messages[0].text.trim(), "job k");
    assert!(
        record
            .provider_message_id
            .unwrap()
            .contains(&messages[0].id),
        "the inbox's id is recorded"
    );
    assert_eq!(results(&store, record.id).await, ["sent"]);
}

async fn three_temporary_rejections_then_delivered_on_the_fourth_attempt<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let faults = rejecting(3, Rejection::Temporary);
    let (inbox, record) = settle(&store, faults, email_job("k", "bob@example.com")).await;
    assert_eq!(record.status, JobStatus::Sent);
    assert_eq!(record.attempts, 4);
    // The inbox's temporary rejection is SMTP 451: throttling, retried without spending the
    // attempt budget (issue 14, item 1).
    assert_eq!(
        results(&store, record.id).await,
        ["throttled", "throttled", "throttled", "sent"]
    );
    assert_eq!(record.free_attempts, 3);
    assert_eq!(inbox.messages(None).len(), 1);
}

async fn a_permanent_rejection_is_dead_at_once_with_its_reason<S: Backend>(store: S, _db: TestDb) {
    let faults = rejecting(1, Rejection::Permanent);
    let (inbox, record) = settle(&store, faults, email_job("k", "c@example.com")).await;
    assert_eq!(record.status, JobStatus::Dead);
    assert_eq!(record.attempts, 1);
    assert!(
        record.last_error.unwrap().contains("550"),
        "the provider's reason is kept"
    );
    assert!(inbox.messages(None).is_empty());
}

async fn attempts_stop_at_the_maximum_and_the_job_is_dead<S: Backend>(store: S, _db: TestDb) {
    // Over HTTP the inbox's temporary rejection is a 503 without `Retry-After`: a plain retry
    // (over SMTP it is a 451, throttling, which spends no attempt).
    let faults = rejecting(100, Rejection::Temporary);
    let policy = RetryPolicy {
        max_attempts: 3,
        ..FAST
    };
    let job = email_job("k", "d@example.com");
    let via = Via::Http(Duration::from_secs(2));
    let (_inbox, record) = settle_with(&store, faults, job, via, policy).await;
    assert_eq!(record.status, JobStatus::Dead);
    assert_eq!(record.attempts, 3);
    assert!(
        record
            .last_error
            .unwrap()
            .starts_with("gave up after 3 attempts")
    );
}

/// Asserts that the job is sent, its first attempt's outcome unknown.
async fn sent_after_an_unknown<S: Backend>(store: &S, record: &JobRecord) {
    assert_eq!(record.status, JobStatus::Sent);
    assert_eq!(results(store, record.id).await, ["unknown", "sent"]);
}

async fn accept_then_drop_with_a_deduplicating_provider_delivers_exactly_one_email<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let faults = losing_the_first_answer(Faults::provider());
    let (inbox, record) = settle(&store, faults, email_job("k", "e@example.com")).await;
    sent_after_an_unknown(&store, &record).await;
    let emails = inbox.messages(Some("e@example.com"));
    assert_eq!(emails.len(), 1, "exactly one email");
    assert_eq!(inbox.stats().deduplicated, 1);
}

/// Issue 14, item 4: the inbox (like Resend's SMTP) reads only `Resend-Idempotency-Key`; a
/// mailer that sends the key under another name (`Idempotency-Key`, as every SMTP send did
/// before) is not deduplicated. The test above, with the default mailer, gets one email.
async fn a_provider_that_does_not_read_the_mailer_s_header_delivers_the_resend_again<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let (inbox, running) = inbox(losing_the_first_answer(Faults::provider())).await;
    enqueue(&store, email_job("k", "w@example.com")).await;
    let mailer = smtp_with_header(&running, Some("Idempotency-Key"));
    let record = run_until_settled(&worker(&store, mailer, FAST), &store, "k").await;
    sent_after_an_unknown(&store, &record).await;
    let emails = inbox.messages(Some("w@example.com"));
    let why = "the provider saw no key it reads: the resend is a second email";
    assert_eq!(emails.len(), 2, "{why}");
    assert_eq!(inbox.stats().deduplicated, 0);
}

async fn accept_then_drop_over_plain_smtp_records_the_duplicate<S: Backend>(store: S, _db: TestDb) {
    let faults = losing_the_first_answer(Faults::default());
    let (inbox, record) = settle(&store, faults, email_job("k", "f@example.com")).await;
    assert_eq!(record.status, JobStatus::Sent);
    // Plain SMTP cannot deduplicate: the unknown outcome costs a second copy, and it shows.
    assert_eq!(inbox.messages(Some("f@example.com")).len(), 2);
    assert_eq!(inbox.stats().duplicates, 1);
}

async fn the_http_provider_gets_the_same_idempotency_key_on_every_retry<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let faults = losing_the_first_answer(Faults {
        reject_next: 1,
        ..Faults::provider()
    });
    let job = email_job("k", "g@example.com");
    let via = Via::Http(Duration::from_millis(500));
    let (inbox, record) = settle_with(&store, faults, job, via, FAST).await;
    assert_eq!(record.status, JobStatus::Sent);
    assert_eq!(
        results(&store, record.id).await,
        ["retry", "unknown", "sent"]
    );
    let messages = inbox.messages(Some("g@example.com"));
    assert_eq!(messages.len(), 1);
    assert_eq!(
        messages[0].idempotency_key.as_deref(),
        Some(record.delivery_key.to_string().as_str())
    );
    assert_eq!(inbox.stats().attempts, 3);
}

async fn a_job_past_its_deadline_is_not_sent<S: Backend>(store: S, _db: TestDb) {
    let job = email_job("k", "h@example.com")
        .not_after(OffsetDateTime::now_utc() - time::Duration::seconds(1));
    let (inbox, record) = settle(&store, Faults::default(), job).await;
    assert_eq!(record.status, JobStatus::Dead);
    assert_eq!(results(&store, record.id).await, ["expired"]);
    assert!(inbox.messages(None).is_empty());
}

async fn an_idle_worker_wakes_when_a_job_commits_and_stops_on_shutdown<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let (inbox, running) = inbox(Faults::default()).await;
    // Polling alone would take a minute: only the wake-up (LISTEN/NOTIFY, or the in-process
    // signal) can deliver within the test's few seconds.
    let config = WorkerConfig {
        poll_interval: Duration::from_secs(60),
        ..WorkerConfig::default()
    };
    let (spy, mut claims) = Spy::watching(store.clone());
    let worker = Worker::new(spy, config).handle_with_policy(
        "email",
        EmailHandler::new(smtp(&running)),
        FAST,
    );
    let shutdown = CancellationToken::new();
    let running_worker = tokio::spawn(worker.run(shutdown.clone()));
    // Its first claim found nothing: it is idle now.
    idle(&mut claims).await;
    enqueue(&store, email_job("k", "i@example.com")).await;
    assert_eq!(first_emails_to(&inbox, "i@example.com").await, 1);
    stop(&shutdown, running_worker, "stops promptly").await;
}

async fn four_workers_deliver_a_hundred_jobs_exactly_once<S: Backend>(store: S, _db: TestDb) {
    let (inbox, running) = inbox(Faults::default()).await;
    for i in 0..100 {
        enqueue(
            &store,
            email_job(&format!("k{i}"), &format!("u{i}@example.com")),
        )
        .await;
    }
    let shutdown = CancellationToken::new();
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let config = WorkerConfig {
                id: format!("w{i}"),
                batch: 8,
                poll_interval: Duration::from_millis(50),
                ..WorkerConfig::default()
            };
            let worker = Worker::new(store.clone(), config)
                .handle("email", EmailHandler::new(smtp(&running)));
            tokio::spawn(worker.run(shutdown.clone()))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while inbox.messages(None).len() < 100 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    for w in workers {
        w.await.unwrap().unwrap();
    }
    assert_eq!(inbox.messages(None).len(), 100);
    assert_eq!(inbox.stats().duplicates, 0);
    assert_eq!(store.pending().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poll_only_worker_still_delivers() {
    let (store, _db) = crate::support::postgres().await;
    let store = store.poll_only();
    let (inbox, running) = inbox(Faults::default()).await;
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(100),
        ..WorkerConfig::default()
    };
    let worker =
        Worker::new(store.clone(), config).handle("email", EmailHandler::new(smtp(&running)));
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(worker.run(shutdown.clone()));
    enqueue(&store, email_job("k", "p@example.com")).await;
    assert_eq!(first_emails_to(&inbox, "p@example.com").await, 1);
    shutdown.cancel();
    handle.await.unwrap().unwrap();
}

/// Counts how many of its jobs run at once.
#[derive(Clone)]
struct Counting(Arc<Gauge>);

struct Gauge {
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
}

impl oncely_outbox::Handler for Counting {
    fn run<'a>(
        &'a self,
        _job: &'a oncely_outbox::Job,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = oncely_outbox::Delivery> + Send + 'a>>
    {
        use std::sync::atomic::Ordering::SeqCst;
        Box::pin(async move {
            let now = self.0.now.fetch_add(1, SeqCst) + 1;
            self.0.max.fetch_max(now, SeqCst);
            tokio::time::sleep(Duration::from_millis(30)).await;
            self.0.now.fetch_sub(1, SeqCst);
            oncely_outbox::Delivery::Sent {
                provider_message_id: None,
            }
        })
    }
}

fn gauge() -> Counting {
    Counting(Arc::new(Gauge {
        now: 0.into(),
        max: 0.into(),
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limited_kind_runs_at_most_its_concurrency_while_others_run_in_full_batches() {
    use oncely_outbox::KindOptions;
    let (store, _db) = crate::support::sqlite().await;
    for i in 0..12 {
        enqueue(&store, plain(format!("charge:{i}"), "charge")).await;
        enqueue(&store, plain(format!("usage:{i}"), "usage")).await;
    }
    let (charges, usage) = (gauge(), gauge());
    let worker = Worker::new(store.clone(), batch_of(8))
        .handle_with(
            "charge",
            charges.clone(),
            KindOptions {
                concurrency: Some(2),
                ..KindOptions::default()
            },
        )
        .handle("usage", usage.clone());
    assert_eq!(worker.drain().await.unwrap(), 24);
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(
        charges.0.max.load(SeqCst),
        2,
        "never more than 2 charges at once"
    );
    assert!(
        usage.0.max.load(SeqCst) > 2,
        "unlimited kinds run a whole batch at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_restricted_to_some_kinds_leaves_the_others() {
    let (store, _db) = crate::support::sqlite().await;
    enqueue(&store, plain("a:1", "a")).await;
    enqueue(&store, plain("b:1", "b")).await;
    let worker = || {
        Worker::new(store.clone(), WorkerConfig::default())
            .handle("a", gauge())
            .handle("b", gauge())
    };
    let only_a = worker().restrict_to(&["a".to_owned()]).unwrap();
    assert_eq!(only_a.kinds(), ["a"]);
    assert_eq!(only_a.drain().await.unwrap(), 1);
    assert_eq!(
        store.job("b:1").await.unwrap().unwrap().status,
        JobStatus::Pending
    );
    let error = worker()
        .restrict_to(&["c".to_owned()])
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("\"c\"") && error.contains("a, b"), "{error}");
}

/// Regression (chaos run): the worker used to claim a batch and wait for all of it, so one send
/// stuck until its timeout stalled every other job. Now each job holds only its own slot.
async fn a_stuck_job_holds_its_own_slot_and_never_the_next_claim<S: Backend>(
    store: S,
    _db: TestDb,
) {
    use oncely_outbox::{Delivery, Handler, Job};
    use std::future::Future;
    use std::pin::Pin;

    /// `stuck` waits until the test releases it; every other job is sent at once.
    struct Gate {
        release: Arc<tokio::sync::Notify>,
        sent: Arc<std::sync::Mutex<Vec<String>>>,
    }
    impl Handler for Gate {
        fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
            Box::pin(async move {
                if job.operation_key == "stuck" {
                    self.release.notified().await;
                }
                self.sent.lock().unwrap().push(job.operation_key.clone());
                Delivery::Sent {
                    provider_message_id: None,
                }
            })
        }
    }
    let release = Arc::new(tokio::sync::Notify::new());
    let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
    enqueue(&store, plain("stuck", "gate")).await;
    for i in 0..20 {
        enqueue(&store, plain(format!("fast-{i}"), "gate")).await;
    }
    let config = WorkerConfig {
        batch: 4,
        poll_interval: Duration::from_millis(50),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(store.clone(), config).handle(
        "gate",
        Gate {
            release: release.clone(),
            sent: sent.clone(),
        },
    );
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(worker.run(shutdown.clone()));
    // All twenty others go through while "stuck" still holds one of the four slots.
    let all_fast = async {
        while sent.lock().unwrap().len() < 20 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let finished = tokio::time::timeout(Duration::from_secs(20), all_fast).await;
    let so_far = sent.lock().unwrap().clone();
    assert!(
        finished.is_ok(),
        "a stuck job held the others back: sent {so_far:?}"
    );
    assert!(!so_far.contains(&"stuck".to_string()));
    release.notify_one();
    stop(&shutdown, handle, "stops once the stuck job ends").await;
    assert_eq!(
        sent.lock().unwrap().len(),
        21,
        "the stuck job finished before shutdown"
    );
    assert_eq!(store.pending().await.unwrap(), 0);
}
