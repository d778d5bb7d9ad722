//! Recording results survives a database blip: a failed `finish_all` after the sends happened
//! is retried (fenced by the lease token), so the batch is not sent again after its lease.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use oncely_outbox::{Delivery, Handler, Job, JobStatus, NewJob, Worker, WorkerConfig};
use oncely_testdb::TestDb;

use crate::support::{Backend, Spy, both_stores};

both_stores!(a_failed_recording_is_retried_and_nothing_is_sent_twice);

/// Counts its runs per operation key; always succeeds.
struct Counting(Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>);

impl Handler for Counting {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        *self
            .0
            .lock()
            .unwrap()
            .entry(job.operation_key.clone())
            .or_default() += 1;
        Box::pin(async {
            Delivery::Sent {
                provider_message_id: None,
            }
        })
    }
}

async fn a_failed_recording_is_retried_and_nothing_is_sent_twice<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let keys: Vec<String> = (0..3).map(|i| format!("blip:{i}")).collect();
    for key in &keys {
        store
            .enqueue_with_business_row(NewJob::new(key, "blip", serde_json::json!({})), true)
            .await
            .unwrap();
    }
    let flaky = Spy::new(store.clone());
    flaky.finish_failures.store(3, Ordering::SeqCst);
    let sends = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let lease = Duration::from_secs(2);
    let worker = Worker::new(
        flaky.clone(),
        WorkerConfig {
            lease,
            ..WorkerConfig::default()
        },
    )
    .handle("blip", Counting(sends.clone()));
    assert_eq!(
        worker.run_once().await.unwrap(),
        3,
        "recorded despite the blip"
    );
    // Jobs finishing at different moments may be recorded in more than one batch.
    assert_eq!(
        flaky.finish_failures.load(Ordering::SeqCst),
        0,
        "every injected failure happened"
    );
    assert!(
        flaky.finish_calls.load(Ordering::SeqCst) >= 4,
        "three failures, then success"
    );
    // Past the lease: with the result lost, the jobs would be claimed and sent again now.
    store.clock().advance(lease + Duration::from_millis(200));
    assert_eq!(worker.drain().await.unwrap(), 0, "nothing left to run");
    for key in &keys {
        let record = store.job(key).await.unwrap().unwrap();
        assert_eq!(record.status, JobStatus::Sent, "{key}");
        assert_eq!(sends.lock().unwrap()[key], 1, "{key} sent exactly once");
    }
}
