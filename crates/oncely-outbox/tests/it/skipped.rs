//! Issue 15, item 4: suppressed is not dead. A job its handler chose not to run
//! ([`Delivery::Skipped`]: a decoy, an email over a cap) ends `skipped` with its reason: never
//! among the dead jobs an operator lists, counts and re-drives; listed by
//! [`JobStore::skipped`]; pruned like every finished job.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use oncely_outbox::store::{BulkRedrive, DeadFilter, JobFilter, PROVIDER_DEDUPE_WINDOW};
use oncely_outbox::{Delivery, Handler, Job, JobStatus, NewJob, Worker, WorkerConfig};
use oncely_testdb::TestDb;
use serde_json::json;

use crate::support::{Backend, both_stores};

both_stores!(a_skipped_job_is_skipped_never_dead_nor_re_driven_and_is_pruned);

/// Skips a job whose payload says `"skip"`, fails for good one that says `"fail"`.
struct SkipOrFail;

impl Handler for SkipOrFail {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        let delivery = match job.payload["do"].as_str() {
            Some("skip") => Delivery::Skipped("suppressed: over 5 emails per 1h".into()),
            _ => Delivery::Permanent("550 no such mailbox".into()),
        };
        Box::pin(async move { delivery })
    }
}

async fn a_skipped_job_is_skipped_never_dead_nor_re_driven_and_is_pruned<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let worker = Worker::new(store.clone(), WorkerConfig::default()).handle("email", SkipOrFail);
    let enqueued_at = store.clock().now();
    for (key, what) in [
        ("capped:1", "skip"),
        ("failed:1", "fail"),
        ("capped:2", "skip"),
    ] {
        let job = NewJob::new(key, "email", json!({ "do": what, "to": key }));
        store.enqueue_with_business_row(job, true).await.unwrap();
        store.clock().advance(Duration::from_secs(1));
    }
    assert_eq!(worker.drain().await.unwrap(), 3);

    let capped = store.job("capped:1").await.unwrap().unwrap();
    assert_eq!(capped.status, JobStatus::Skipped);
    assert_eq!(
        capped.last_error.as_deref(),
        Some("suppressed: over 5 emails per 1h")
    );
    let attempts = store.attempts(capped.id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].result.as_deref(), Some("skipped"));
    assert_eq!(
        store.job("failed:1").await.unwrap().unwrap().status,
        JobStatus::Dead
    );

    // Listed by status: the dead are the real failures only.
    let listed = |status| {
        let store = store.clone();
        async move {
            let filter = JobFilter {
                status: Some(status),
                ..JobFilter::default()
            };
            let jobs = store.list(&filter).await.unwrap();
            jobs.into_iter()
                .map(|j| j.operation_key)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(JobStatus::Dead).await, ["failed:1"]);
    assert_eq!(listed(JobStatus::Skipped).await, ["capped:2", "capped:1"]);

    // The skipped, newest first, with their reason, payload and when they were skipped.
    let skipped = store.skipped(10).await.unwrap();
    let keys: Vec<&str> = skipped.iter().map(|j| j.operation_key.as_str()).collect();
    assert_eq!(keys, ["capped:2", "capped:1"]);
    assert_eq!(skipped[0].kind, "email");
    assert_eq!(skipped[0].payload["to"], "capped:2");
    assert_eq!(
        skipped[1].reason.as_deref(),
        Some("suppressed: over 5 emails per 1h")
    );
    assert!(
        skipped[0].skipped_at >= enqueued_at && skipped[0].skipped_at <= store.clock().now(),
        "{skipped:?}"
    );
    assert_eq!(store.skipped(1).await.unwrap().len(), 1, "the limit holds");

    // Neither counted, nor sampled, nor re-driven, one by one or in bulk.
    let every = DeadFilter::default();
    let dead = store
        .dead_jobs(&every, 10, PROVIDER_DEDUPE_WINDOW)
        .await
        .unwrap();
    assert_eq!(dead.matching, 1);
    assert_eq!(dead.sample.len(), 1);
    assert_eq!(dead.sample[0].operation_key, "failed:1");
    let suppressed = DeadFilter {
        reason_contains: Some("suppressed".into()),
        ..DeadFilter::default()
    };
    assert_eq!(
        store
            .dead_jobs(&suppressed, 10, PROVIDER_DEDUPE_WINDOW)
            .await
            .unwrap()
            .matching,
        0
    );
    assert!(!store.redrive("capped:1").await.unwrap());
    assert_eq!(
        store.redrive_dead(&suppressed, None).await.unwrap(),
        BulkRedrive::Redriven(0)
    );
    assert_eq!(
        store.redrive_dead(&every, Some(1)).await.unwrap(),
        BulkRedrive::Redriven(1),
        "only the failed job"
    );
    assert_eq!(
        store.job("capped:1").await.unwrap().unwrap().status,
        JobStatus::Skipped
    );
    assert_eq!(worker.drain().await.unwrap(), 1, "the re-driven one runs");

    // Pruned once the retention passed since they were skipped.
    assert_eq!(
        store.prune(Duration::from_secs(3600), 100).await.unwrap(),
        0
    );
    store.clock().advance(Duration::from_secs(3601));
    assert_eq!(
        store.prune(Duration::from_secs(3600), 100).await.unwrap(),
        3
    );
    assert!(store.job("capped:1").await.unwrap().is_none());
    assert!(store.skipped(10).await.unwrap().is_empty());
}
