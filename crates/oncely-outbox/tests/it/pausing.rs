//! Issue 14, item 2: bad credentials pause, they do not kill. A provider that refuses our API
//! key (401) pauses the kind in the worker: its jobs stay pending and spend no attempt, one
//! probe job goes out per interval, and the kind resumes by itself once the provider accepts.
//! Before, each job the provider refused was dead after one attempt.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use oncely_outbox::mail::EmailHandler;
use oncely_outbox::{JobStatus, NewJob, Worker, WorkerConfig};
use oncely_testdb::TestDb;

use crate::provider::{FakeApi, accepted};
use crate::support::{Backend, both_stores, email_job, enqueue_emails, finished_results, mailer};

/// `KindOptions::probe_interval`'s default.
const INTERVAL: Duration = Duration::from_secs(30);

/// A provider that refuses our API key (401) until the flag it returns is set, then accepts;
/// with `first_fails`, its first answer is a 500 instead.
async fn refusing_until_told(first_fails: bool) -> (FakeApi, Arc<AtomicBool>) {
    let accepting = Arc::new(AtomicBool::new(false));
    let told = accepting.clone();
    let api = FakeApi::start(move |n| match n {
        0 if first_fails => (500, vec![], r#"{"message":"oops"}"#.into()),
        _ if told.load(Ordering::SeqCst) => accepted(n),
        _ => (
            401,
            vec![],
            r#"{"statusCode":401,"message":"API key is invalid"}"#.into(),
        ),
    })
    .await;
    (api, accepting)
}

both_stores!(a_refused_kind_pauses_is_probed_once_per_interval_and_resumes_by_itself);

async fn a_refused_kind_pauses_is_probed_once_per_interval_and_resumes_by_itself<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let (api, accepting) = refusing_until_told(false).await;
    let mailer = mailer(&api.url, Duration::from_secs(5));
    let worker = Worker::new(store.clone(), WorkerConfig::default())
        .handle("email", EmailHandler::new(mailer));
    enqueue_emails(&store, &["a", "b", "c"]).await;
    // The three in flight when the kind paused finish normally: refused, pending.
    assert_eq!(worker.drain().await.unwrap(), 3);
    assert_eq!(api.requests(), 3);
    for key in ["a", "b", "c"] {
        let job = store.job(key).await.unwrap().unwrap();
        assert_eq!(
            job.status,
            JobStatus::Pending,
            "{key}: {:?}",
            job.last_error
        );
        assert_eq!(finished_results(&store, key).await, ["paused"]);
    }

    // Paused: a new job waits with the others; nothing goes out until the interval ends.
    enqueue_emails(&store, &["d"]).await;
    assert_eq!(worker.drain().await.unwrap(), 0);
    store.clock().advance(INTERVAL - Duration::from_secs(1));
    assert_eq!(worker.drain().await.unwrap(), 0);
    assert_eq!(api.requests(), 3);

    // One probe per interval, refused twice.
    for probes in 1..=2 {
        store.clock().advance(if probes == 1 {
            Duration::from_secs(1)
        } else {
            INTERVAL
        });
        assert_eq!(worker.drain().await.unwrap(), 1, "probe {probes}");
        assert_eq!(worker.drain().await.unwrap(), 0, "one probe per interval");
        assert_eq!(api.requests(), 3 + probes);
    }

    // The provider accepts again: the next probe goes through and the kind resumes by itself.
    accepting.store(true, Ordering::SeqCst);
    store.clock().advance(INTERVAL - Duration::from_secs(1));
    assert_eq!(worker.drain().await.unwrap(), 0, "not before the interval");
    store.clock().advance(Duration::from_secs(1));
    assert_eq!(worker.drain().await.unwrap(), 4, "the probe, then the rest");
    assert_eq!(api.requests(), 9);
    for key in ["a", "b", "c", "d"] {
        let job = store.job(key).await.unwrap().unwrap();
        assert_eq!(job.status, JobStatus::Sent, "{key}");
        let results = finished_results(&store, key).await;
        assert_eq!(results.last().map(String::as_str), Some("sent"), "{key}");
        assert!(
            results[..results.len() - 1].iter().all(|r| r == "paused"),
            "{results:?}"
        );
    }
    assert_eq!(store.pending().await.unwrap(), 0);
}

/// Sends emails, but skips a job whose payload says `"decoy": true` without asking the provider
/// (like the service's jobs for unknown addresses).
struct DecoysSkipped(EmailHandler);

impl oncely_outbox::Handler for DecoysSkipped {
    fn run<'a>(&'a self, job: &'a oncely_outbox::Job) -> oncely_outbox::DeliveryFuture<'a> {
        if job.payload["decoy"] == true {
            return Box::pin(async { oncely_outbox::Delivery::Skipped("a decoy".into()) });
        }
        self.0.run(job)
    }
}

both_stores!(skipped_decoys_neither_resume_a_paused_kind_nor_let_its_jobs_through);

/// Review of issue 14: a probe that picked a decoy (skipped, the provider never asked) closed the
/// breaker, and the next claim sent every waiting job with the refused key — anyone could turn
/// one probe into a batch of refused calls by asking for resets of unknown addresses.
async fn skipped_decoys_neither_resume_a_paused_kind_nor_let_its_jobs_through<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let api = FakeApi::start(|_| (401, vec![], r#"{"message":"bad key"}"#.into())).await;
    let mailer = mailer(&api.url, Duration::from_secs(5));
    let worker = Worker::new(store.clone(), WorkerConfig::default())
        .handle("email", DecoysSkipped(EmailHandler::new(mailer)));
    enqueue_emails(&store, &["first"]).await;
    assert_eq!(worker.drain().await.unwrap(), 1);
    assert_eq!(api.requests(), 1, "refused: the kind pauses");
    // Decoys first in line, then real jobs.
    for i in 0..4 {
        let decoy = NewJob::new(
            format!("decoy-{i}"),
            "email",
            serde_json::json!({"decoy": true}),
        );
        store.enqueue_with_business_row(decoy, true).await.unwrap();
    }
    for i in 0..4 {
        store
            .enqueue_with_business_row(email_job(&format!("real-{i}")), true)
            .await
            .unwrap();
    }
    for interval in 1..=3 {
        store.clock().advance(INTERVAL);
        worker.drain().await.unwrap();
        assert!(
            api.requests() <= 1 + interval,
            "interval {interval}: {} calls with the refused key",
            api.requests()
        );
    }
    for i in 0..4 {
        let key = format!("decoy-{i}");
        let job = store.job(&key).await.unwrap().unwrap();
        assert_eq!(job.status, JobStatus::Skipped, "{key}: skipped, not dead");
    }
    assert_eq!(
        api.requests(),
        4,
        "one probe per interval, whatever the decoys"
    );
}

both_stores!(
    a_retry_claimed_after_its_horizon_is_not_sent,
    a_job_only_ever_refused_is_sent_however_late,
);

/// A worker for kind `email` over `api`, with a one-hour horizon.
fn hourly_worker<S: Backend>(store: &S, api: &FakeApi) -> Worker<S> {
    let options = oncely_outbox::KindOptions {
        policy: oncely_outbox::RetryPolicy {
            horizon: HOUR,
            ..oncely_outbox::RetryPolicy::DEFAULT
        },
        concurrency: None,
        probe_interval: INTERVAL,
        per_partition: None,
        on_unknown: oncely_outbox::OnUnknown::Resend,
        reconcile_grace: oncely_outbox::KindOptions::DEFAULT_RECONCILE_GRACE,
    };
    let mailer = mailer(&api.url, Duration::from_secs(5));
    Worker::new(store.clone(), WorkerConfig::default()).handle_with(
        "email",
        EmailHandler::new(mailer),
        options,
    )
}

const HOUR: Duration = Duration::from_secs(3600);

/// Review of issue 14: the horizon was checked only after a send, and a paused kind's jobs wait
/// for probes, so a backlog could be sent long after the provider forgot their keys (a job whose
/// earlier attempt had an unknown outcome or a 5xx would then be a second email). A retry
/// claimed after its horizon, after an attempt that may have reached the provider, is dead
/// without running; a re-drive sends it with a fresh horizon.
async fn a_retry_claimed_after_its_horizon_is_not_sent<S: Backend>(store: S, _db: TestDb) {
    // A 500 (it may have reached the provider), then refusals, then accepted.
    let (api, accepting) = refusing_until_told(true).await;
    let worker = hourly_worker(&store, &api);
    enqueue_emails(&store, &["late"]).await;
    worker.drain().await.unwrap();
    store.clock().advance(Duration::from_secs(5));
    worker.drain().await.unwrap();
    assert_eq!(finished_results(&store, "late").await, ["retry", "paused"]);
    // The provider accepts again only after the horizon has passed.
    accepting.store(true, Ordering::SeqCst);
    store.clock().advance(HOUR);
    worker.drain().await.unwrap();
    let job = store.job("late").await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Dead, "{:?}", job.last_error);
    assert!(
        job.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("retry horizon"),
        "{:?}",
        job.last_error
    );
    assert_eq!(api.requests(), 2, "not sent after its horizon");
    // A re-drive starts a fresh horizon: sent.
    assert!(store.redrive("late").await.unwrap());
    worker.drain().await.unwrap();
    let job = store.job("late").await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Sent, "{:?}", job.last_error);
    assert_eq!(api.requests(), 3);
}

/// Second review of issue 14: a job that was only ever refused (nothing stored at the provider)
/// was killed as "claimed after its horizon" once an outage outlasted the horizon — exactly the
/// jobs the outage held back were lost. It is sent.
async fn a_job_only_ever_refused_is_sent_however_late<S: Backend>(store: S, _db: TestDb) {
    let (api, accepting) = refusing_until_told(false).await;
    let worker = hourly_worker(&store, &api);
    enqueue_emails(&store, &["held"]).await;
    worker.drain().await.unwrap();
    store.clock().advance(INTERVAL);
    worker.drain().await.unwrap();
    assert_eq!(finished_results(&store, "held").await, ["paused", "paused"]);
    accepting.store(true, Ordering::SeqCst);
    store.clock().advance(HOUR);
    worker.drain().await.unwrap();
    let job = store.job("held").await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Sent, "{:?}", job.last_error);
    assert_eq!(api.requests(), 3);
}

/// Refuses the job whose key is `poison` (after the others: a slower answer), accepts the rest.
struct RefusesOnePayload;

impl oncely_outbox::Handler for RefusesOnePayload {
    fn run<'a>(&'a self, job: &'a oncely_outbox::Job) -> oncely_outbox::DeliveryFuture<'a> {
        Box::pin(async move {
            if job.operation_key == "poison" {
                tokio::time::sleep(Duration::from_millis(100)).await;
                oncely_outbox::Delivery::Refused(
                    "HTTP 403: the sender's domain is not verified".into(),
                )
            } else {
                oncely_outbox::Delivery::Sent {
                    provider_message_id: None,
                }
            }
        })
    }
}

both_stores!(a_payload_the_provider_refuses_while_it_accepts_the_rest_does_not_pause_the_kind);

/// Second review of issue 14: a job whose frozen payload the provider refuses for good (a sender
/// it no longer takes) paused its kind again every time it was claimed, for 23 h, and every new
/// email waited up to an interval. A refusal while the provider accepts the kind's other jobs is
/// that job's failure: a plain retry spending its budget; the kind runs on.
async fn a_payload_the_provider_refuses_while_it_accepts_the_rest_does_not_pause_the_kind<
    S: Backend,
>(
    store: S,
    _db: TestDb,
) {
    let worker =
        Worker::new(store.clone(), WorkerConfig::default()).handle("email", RefusesOnePayload);
    for key in ["poison", "a", "b"] {
        store
            .enqueue_with_business_row(email_job(key), true)
            .await
            .unwrap();
    }
    assert_eq!(worker.drain().await.unwrap(), 3);
    assert_eq!(finished_results(&store, "poison").await, ["retry"]);
    let poison = store.job("poison").await.unwrap().unwrap();
    assert_eq!(
        (poison.status, poison.free_attempts),
        (JobStatus::Pending, 0)
    );
    assert!(
        poison
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("this job alone"),
        "{:?}",
        poison.last_error
    );
    // Not paused: a new email goes out at once, without waiting for a probe.
    enqueue_emails(&store, &["c"]).await;
    assert_eq!(worker.drain().await.unwrap(), 1);
    assert_eq!(
        store.job("c").await.unwrap().unwrap().status,
        JobStatus::Sent
    );
}
