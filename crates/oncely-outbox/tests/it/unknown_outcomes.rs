//! Issue 21, item 1: no blind resends. A kind that reconciles unknown outcomes
//! ([`OnUnknown::Reconcile`]) parks a job whose attempt may have reached the provider (an
//! unknown outcome, an attempt its worker abandoned) instead of sending it again; a parked job
//! holds up no other; it is settled as sent (recorded without running, with its follow-ups) or
//! for resending (under the same delivery key, with a fresh budget). A kind that resends keeps
//! today's behaviour.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use oncely_outbox::{
    AttemptResult, Delivery, Ended, Handler, Job, JobStatus, KindOptions, NewJob, OnUnknown,
    RetryPolicy, Settlement, ThenFuture, Worker, WorkerConfig,
};
use oncely_testdb::TestDb;
use serde_json::json;
use uuid::Uuid;

use crate::support::{Backend, LEASE, Runs, both_stores, job_in, kinds, listed};

both_stores!(
    an_unknown_outcome_parks_the_job_under_reconcile_and_is_resent_under_resend,
    an_unknown_outcome_that_spends_the_last_attempt_parks_rather_than_dies,
    settled_as_sent_is_recorded_without_running_and_names_its_follow_ups,
    settled_for_resending_runs_again_under_the_same_key_with_a_fresh_budget,
    a_retry_after_an_abandoned_attempt_is_parked_not_run,
    a_sent_job_whose_follow_ups_cannot_be_named_is_parked_not_run_again,
    a_dead_job_whose_follow_ups_cannot_be_named_is_not_parked_and_keeps_its_reason,
    a_settlement_survives_follow_ups_that_fail_under_either_policy,
    a_redrive_drops_a_settlement_left_on_a_dead_job,
);

/// Runs each job as its payload's `"do"` says, in order of its attempts: `"unknown,sent"` is an
/// unknown outcome on the first run, sent on the second. Notes every run's delivery key; a sent
/// job whose payload says `"follow_up": true` has the follow-up `event:<key>`.
#[derive(Clone, Default)]
struct Scripted {
    runs: Runs,
    /// `then` fails while this holds.
    then_fails: Arc<AtomicBool>,
}

impl Scripted {
    fn runs_of(&self, key: &str) -> Vec<Uuid> {
        self.runs.of(key)
    }
}

impl Handler for Scripted {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        let runs = self.runs.record(job);
        let script = job.payload["do"].as_str().unwrap_or("sent").to_owned();
        let step = script.split(',').nth(runs - 1).unwrap_or("sent").to_owned();
        Box::pin(async move {
            match step.as_str() {
                "unknown" => Delivery::Unknown("the answer to DATA was lost".into()),
                "dead" => Delivery::Permanent("550 mailbox unavailable".into()),
                _ => Delivery::Sent {
                    provider_message_id: Some(format!("msg-{runs}")),
                },
            }
        })
    }

    fn then<'a>(&'a self, job: &'a Job, end: &'a Ended) -> ThenFuture<'a> {
        if self.then_fails.load(Ordering::SeqCst) {
            return Box::pin(async { Err("accounts database unreachable".into()) });
        }
        let follow_ups = match end {
            Ended::Sent { .. } if job.payload["follow_up"] == true => vec![NewJob::new(
                format!("event:{}", job.operation_key),
                "event",
                json!({}),
            )],
            _ => Vec::new(),
        };
        Box::pin(async move { Ok(follow_ups) })
    }
}

fn options(on_unknown: OnUnknown) -> KindOptions {
    KindOptions {
        on_unknown,
        ..KindOptions::default()
    }
}

/// A worker of kind `r` (reconciles) and kind `s` (resends), both run by `handler`.
fn worker<S: Backend>(store: &S, handler: &Scripted) -> Worker<S> {
    Worker::new(store.clone(), WorkerConfig::default())
        .handle_with("r", handler.clone(), options(OnUnknown::Reconcile))
        .handle_with("s", handler.clone(), options(OnUnknown::Resend))
}

async fn enqueue<S: Backend>(store: &S, key: &str, kind: &str, script: &str) -> i64 {
    enqueue_payload(store, key, kind, json!({ "do": script })).await
}

/// As [`enqueue`], with a follow-up (`event:<key>`) once it is sent.
async fn enqueue_followed<S: Backend>(store: &S, key: &str, kind: &str, script: &str) -> i64 {
    enqueue_payload(store, key, kind, json!({ "do": script, "follow_up": true })).await
}

async fn enqueue_payload<S: Backend>(
    store: &S,
    key: &str,
    kind: &str,
    payload: serde_json::Value,
) -> i64 {
    let job = NewJob::new(key, kind, payload);
    store.enqueue_with_business_row(job, true).await.unwrap();
    store.job(key).await.unwrap().unwrap().id
}

fn results(attempts: &[oncely_outbox::job::AttemptRecord]) -> Vec<&str> {
    attempts
        .iter()
        .map(|a| a.result.as_deref().unwrap_or("open"))
        .collect()
}

async fn an_unknown_outcome_parks_the_job_under_reconcile_and_is_resent_under_resend<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let handler = Scripted::default();
    let worker = worker(&store, &handler);
    let parked = enqueue(&store, "r:1", "r", "unknown,sent").await;
    enqueue(&store, "r:2", "r", "sent").await;
    enqueue(&store, "s:1", "s", "unknown,sent").await;
    assert_eq!(worker.drain().await.unwrap(), 3);

    let record = job_in(&store, "r:1", JobStatus::Unknown).await;
    assert_eq!(record.attempts, 1);
    let error = record.last_error.as_deref().unwrap_or_default();
    assert!(
        error.contains("the answer to DATA was lost") && error.contains("parked"),
        "{error}"
    );
    assert_eq!(results(&store.attempts(parked).await.unwrap()), ["unknown"]);
    // A parked job holds up no other of its kind; the kind that resends retries as before.
    assert_eq!(
        store.job("r:2").await.unwrap().unwrap().status,
        JobStatus::Sent
    );
    assert_eq!(
        store.job("s:1").await.unwrap().unwrap().status,
        JobStatus::Pending
    );
    let backlog = store.backlog().await.unwrap();
    assert_eq!((backlog.pending, backlog.parked), (1, 1), "{backlog:?}");

    // Long after every retry delay: the resending kind sent its job again; the parked job was
    // never run again, nor is it due.
    store.clock().advance(Duration::from_secs(3 * 3600));
    assert_eq!(worker.drain().await.unwrap(), 1);
    assert_eq!(
        store.job("s:1").await.unwrap().unwrap().status,
        JobStatus::Sent
    );
    assert_eq!(handler.runs_of("s:1").len(), 2);
    assert_eq!(handler.runs_of("r:1").len(), 1, "a parked job is not run");
    assert_eq!(
        store.job("r:1").await.unwrap().unwrap().status,
        JobStatus::Unknown
    );
    assert!(
        store
            .claim("w", &kinds(&["r"]), 10, LEASE)
            .await
            .unwrap()
            .is_empty(),
        "a parked job is never claimed"
    );
    let backlog = store.backlog().await.unwrap();
    assert_eq!((backlog.pending, backlog.parked), (0, 1), "{backlog:?}");
    assert!(
        (3.0 * 3600.0..3.1 * 3600.0).contains(&backlog.oldest_parked_seconds),
        "parked three hours ago: {backlog:?}"
    );
    // Operators find it by its status, and the list of every status shows it.
    let listed = listed(&store, JobStatus::Unknown).await;
    let keys: Vec<_> = listed.iter().map(|j| j.operation_key.as_str()).collect();
    assert_eq!(keys, ["r:1"]);
}

async fn an_unknown_outcome_that_spends_the_last_attempt_parks_rather_than_dies<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let handler = Scripted::default();
    let one_attempt = |on_unknown| KindOptions {
        policy: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::DEFAULT
        },
        on_unknown,
        ..KindOptions::default()
    };
    let worker = Worker::new(store.clone(), WorkerConfig::default())
        .handle_with("r", handler.clone(), one_attempt(OnUnknown::Reconcile))
        .handle_with("s", handler.clone(), one_attempt(OnUnknown::Resend));
    enqueue_followed(&store, "r:1", "r", "unknown").await;
    enqueue(&store, "s:1", "s", "unknown").await;
    assert_eq!(worker.drain().await.unwrap(), 2);
    assert_eq!(
        store.job("s:1").await.unwrap().unwrap().status,
        JobStatus::Dead,
        "the resending kind gives up as before"
    );
    let record = store.job("r:1").await.unwrap().unwrap();
    assert_eq!(
        record.status,
        JobStatus::Unknown,
        "it may have been sent: neither dead nor resent: {record:?}"
    );
    assert!(
        store.job("event:r:1").await.unwrap().is_none(),
        "no follow-up for a parked job"
    );
}

async fn settled_as_sent_is_recorded_without_running_and_names_its_follow_ups<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let handler = Scripted::default();
    let worker = worker(&store, &handler);
    let id = enqueue_followed(&store, "r:1", "r", "unknown,sent").await;
    worker.drain().await.unwrap();
    assert_eq!(
        store.job("r:1").await.unwrap().unwrap().status,
        JobStatus::Unknown
    );
    assert!(store.job("event:r:1").await.unwrap().is_none());

    assert!(store.settle(id, Settlement::Sent).await.unwrap());
    assert!(
        !store.settle(id, Settlement::Sent).await.unwrap(),
        "settled once: no longer parked"
    );
    assert!(!store.settle(id, Settlement::Resend).await.unwrap());
    assert_eq!(worker.drain().await.unwrap(), 1);
    job_in(&store, "r:1", JobStatus::Sent).await;
    assert_eq!(
        handler.runs_of("r:1").len(),
        1,
        "recorded sent without sending again"
    );
    let attempts = store.attempts(id).await.unwrap();
    assert_eq!(results(&attempts), ["unknown", "sent"]);
    assert!(
        attempts[1]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("settled as sent")),
        "{attempts:?}"
    );
    assert!(
        store.job("event:r:1").await.unwrap().is_some(),
        "its follow-up comes with its final status"
    );
    // Settling a job that is not parked (sent now, or unknown) changes nothing.
    assert!(!store.settle(id, Settlement::Resend).await.unwrap());
    assert!(!store.settle(id + 1000, Settlement::Sent).await.unwrap());
    assert_eq!(
        store.job("r:1").await.unwrap().unwrap().status,
        JobStatus::Sent
    );
}

async fn settled_for_resending_runs_again_under_the_same_key_with_a_fresh_budget<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let handler = Scripted::default();
    let worker = worker(&store, &handler);
    let id = enqueue(&store, "r:1", "r", "unknown,sent").await;
    worker.drain().await.unwrap();
    store.clock().advance(Duration::from_secs(60));
    assert!(store.settle(id, Settlement::Resend).await.unwrap());
    let record = store.job("r:1").await.unwrap().unwrap();
    assert_eq!(record.status, JobStatus::Pending);
    assert_eq!(record.attempts, 0, "a fresh attempt budget");
    assert!(record.redriven_at.is_some(), "a fresh horizon");
    assert_eq!(worker.drain().await.unwrap(), 1);
    job_in(&store, "r:1", JobStatus::Sent).await;
    let keys = handler.runs_of("r:1");
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "the same delivery key");
    assert_eq!(
        results(&store.attempts(id).await.unwrap()),
        ["unknown", "sent"]
    );
}

async fn a_retry_after_an_abandoned_attempt_is_parked_not_run<S: Backend>(store: S, _db: TestDb) {
    let handler = Scripted::default();
    let worker = worker(&store, &handler);
    let reconciled = enqueue(&store, "r:1", "r", "sent").await;
    let resent = enqueue(&store, "s:1", "s", "sent").await;
    // A worker claims both and dies mid-send: its attempts never end.
    let claimed = store
        .claim("dying", &kinds(&["r", "s"]), 10, LEASE)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    store.clock().advance(LEASE + Duration::from_secs(1));

    assert_eq!(worker.drain().await.unwrap(), 2);
    let record = job_in(&store, "r:1", JobStatus::Unknown).await;
    assert!(
        handler.runs_of("r:1").is_empty(),
        "the reconciling kind does not run it again"
    );
    let attempts = store.attempts(reconciled).await.unwrap();
    assert_eq!(results(&attempts), ["abandoned", "parked"]);
    assert_eq!(record.free_attempts, 1, "the parked attempt spent nothing");
    // The resending kind runs it again (same key), as before.
    assert_eq!(handler.runs_of("s:1").len(), 1);
    assert_eq!(
        results(&store.attempts(resent).await.unwrap()),
        ["abandoned", "sent"]
    );
    assert_eq!(AttemptResult::Parked.as_str(), "parked");

    // Settled for resending, it runs: a first attempt of its new drive has nothing abandoned
    // before it.
    assert!(store.settle(reconciled, Settlement::Resend).await.unwrap());
    assert_eq!(worker.drain().await.unwrap(), 1);
    assert_eq!(
        store.job("r:1").await.unwrap().unwrap().status,
        JobStatus::Sent
    );
    assert_eq!(handler.runs_of("r:1").len(), 1);
}

async fn a_sent_job_whose_follow_ups_cannot_be_named_is_parked_not_run_again<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let handler = Scripted::default();
    handler.then_fails.store(true, Ordering::SeqCst);
    // A short lease: `then` is asked again until 95 % of it.
    let config = WorkerConfig {
        lease: Duration::from_secs(2),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(store.clone(), config).handle_with(
        "r",
        handler.clone(),
        options(OnUnknown::Reconcile),
    );
    let id = enqueue_followed(&store, "r:1", "r", "sent").await;
    assert_eq!(worker.drain().await.unwrap(), 1);
    let record = store.job("r:1").await.unwrap().unwrap();
    assert_eq!(
        record.status,
        JobStatus::Unknown,
        "sent, but not recorded: parked rather than sent again: {record:?}"
    );
    assert_eq!(record.provider_message_id.as_deref(), Some("msg-1"));
    assert!(store.job("event:r:1").await.unwrap().is_none());
    store.clock().advance(Duration::from_secs(3600));
    assert_eq!(worker.drain().await.unwrap(), 0, "not due: parked");

    // Settled as sent once the accounts database is back: recorded, with its follow-up, and
    // the email was sent once.
    handler.then_fails.store(false, Ordering::SeqCst);
    assert!(store.settle(id, Settlement::Sent).await.unwrap());
    assert_eq!(worker.drain().await.unwrap(), 1);
    let record = store.job("r:1").await.unwrap().unwrap();
    assert_eq!(record.status, JobStatus::Sent);
    assert_eq!(record.provider_message_id.as_deref(), Some("msg-1"));
    assert!(store.job("event:r:1").await.unwrap().is_some());
    assert_eq!(handler.runs_of("r:1").len(), 1);
}

/// A worker of kind `r` with `on_unknown` and a 2 s lease (`then` is asked again until 95 % of
/// it).
fn short_lease_worker<S: Backend>(
    store: &S,
    handler: &Scripted,
    on_unknown: OnUnknown,
) -> Worker<S> {
    let config = WorkerConfig {
        lease: Duration::from_secs(2),
        ..WorkerConfig::default()
    };
    Worker::new(store.clone(), config).handle_with("r", handler.clone(), options(on_unknown))
}

/// Review of cb88ae4, finding 1: a job that died (a permanent 550) and whose follow-ups could
/// not be named reached no one: it was parked as "the provider may have accepted it", its 550
/// lost, and `settle --sent` then recorded a refused email as sent. It is retried as under
/// `Resend` (only to name its follow-ups), and its reason stays.
async fn a_dead_job_whose_follow_ups_cannot_be_named_is_not_parked_and_keeps_its_reason<
    S: Backend,
>(
    store: S,
    _db: TestDb,
) {
    let handler = Scripted::default();
    handler.then_fails.store(true, Ordering::SeqCst);
    let worker = short_lease_worker(&store, &handler, OnUnknown::Reconcile);
    enqueue(&store, "r:1", "r", "dead,dead").await;
    assert_eq!(worker.drain().await.unwrap(), 1);
    let record = job_in(&store, "r:1", JobStatus::Pending).await;
    let error = record.last_error.as_deref().unwrap_or_default();
    assert!(
        error.contains("550 mailbox unavailable") && !error.contains("parked"),
        "{error}"
    );
    handler.then_fails.store(false, Ordering::SeqCst);
    store.clock().advance(Duration::from_secs(60));
    assert_eq!(worker.drain().await.unwrap(), 1);
    assert_eq!(
        store.job("r:1").await.unwrap().unwrap().status,
        JobStatus::Dead
    );
}

/// Review of cb88ae4, finding 2: the claim that carried a settlement ("sent") cleared it even
/// when it ended pending (its follow-ups failed), so a worker that resends then ran the handler:
/// a second email after the operator said the first arrived. The settlement now stays until a
/// final status is recorded, under either policy.
async fn a_settlement_survives_follow_ups_that_fail_under_either_policy<S: Backend>(
    store: S,
    _db: TestDb,
) {
    for on_unknown in [OnUnknown::Resend, OnUnknown::Reconcile] {
        let handler = Scripted::default();
        let key = format!("r:{}", on_unknown.as_str());
        let id = enqueue_followed(&store, &key, "r", "unknown,sent").await;
        short_lease_worker(&store, &handler, OnUnknown::Reconcile)
            .drain()
            .await
            .unwrap();
        assert_eq!(
            store.job(&key).await.unwrap().unwrap().status,
            JobStatus::Unknown
        );
        assert!(store.settle(id, Settlement::Sent).await.unwrap());

        // The worker that carries out the settlement cannot name the follow-ups this time.
        handler.then_fails.store(true, Ordering::SeqCst);
        let worker = short_lease_worker(&store, &handler, on_unknown);
        assert_eq!(worker.drain().await.unwrap(), 1);
        let record = store.job(&key).await.unwrap().unwrap();
        assert_eq!(
            record.status,
            JobStatus::Pending,
            "{on_unknown:?}: {record:?}"
        );
        handler.then_fails.store(false, Ordering::SeqCst);
        store.clock().advance(Duration::from_secs(60));
        assert_eq!(worker.drain().await.unwrap(), 1);
        let record = store.job(&key).await.unwrap().unwrap();
        assert_eq!(record.status, JobStatus::Sent, "{on_unknown:?}: {record:?}");
        assert_eq!(
            handler.runs_of(&key).len(),
            1,
            "{on_unknown:?}: settled as sent, never sent again"
        );
        assert!(store.job(&format!("event:{key}")).await.unwrap().is_some());
    }
}

/// Review of cb88ae4, finding 4: a previous release's worker ignores a settlement (and does not
/// clear it); if that job then dies, a re-drive must run it, not record it sent unrun.
async fn a_redrive_drops_a_settlement_left_on_a_dead_job<S: Backend>(store: S, _db: TestDb) {
    let handler = Scripted::default();
    let worker = worker(&store, &handler);
    for key in ["r:one", "r:bulk"] {
        let id = enqueue(&store, key, "r", "unknown,sent").await;
        worker.drain().await.unwrap();
        assert!(store.settle(id, Settlement::Sent).await.unwrap());
        // What a previous release's worker leaves: it ran the job (ignoring the settlement),
        // which died, with `settled` still set.
        let claimed = store.claim("old", &kinds(&["r"]), 1, LEASE).await.unwrap();
        assert_eq!(claimed.len(), 1);
        assert!(claimed[0].settled_as_sent);
        let dead = oncely_outbox::store::Finish::dead(AttemptResult::Dead, "550".into());
        assert!(store.finish(&claimed[0], &dead).await.unwrap());
        // (This release's finish clears it; a previous release's did not.)
        store
            .execute_for_test(
                "UPDATE oncely_outbox SET settled = 'sent' WHERE id = $1",
                id,
            )
            .await;
    }
    assert!(store.redrive("r:one").await.unwrap());
    let bulk = oncely_outbox::store::DeadFilter {
        kind: Some("r".into()),
        ..oncely_outbox::store::DeadFilter::default()
    };
    store.redrive_dead(&bulk, None).await.unwrap();
    let claimed = store.claim("w", &kinds(&["r"]), 10, LEASE).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert!(
        claimed.iter().all(|job| !job.settled_as_sent),
        "a re-drive runs the job"
    );
}
