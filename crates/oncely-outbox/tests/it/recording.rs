//! Recording results survives a database blip: a failed `finish_all` after the sends happened
//! is retried (fenced by the lease token), so the batch is not sent again after its lease.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use oncely_outbox::store::{Backlog, Finish, JobFilter, Wakeup};
use oncely_outbox::{
    Delivery, Handler, Job, JobRecord, JobStatus, JobStore, NewJob, OutboxError, Worker,
    WorkerConfig,
};
use oncely_testdb::TestDb;

use crate::support::{Backend, both_stores};

both_stores!(a_failed_recording_is_retried_and_nothing_is_sent_twice);

/// A store whose first `failures` `finish_all` calls fail as a dropped connection would.
#[derive(Clone)]
struct FailingFinish<S> {
    inner: S,
    failures: Arc<AtomicU32>,
    calls: Arc<AtomicU32>,
}

impl<S: JobStore> JobStore for FailingFinish<S> {
    async fn migrate(&self) -> Result<(), OutboxError> {
        self.inner.migrate().await
    }
    async fn claim(
        &self,
        worker: &str,
        kinds: &[String],
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<Job>, OutboxError> {
        self.inner.claim(worker, kinds, limit, lease).await
    }
    async fn finish_all(&self, done: &[(&Job, &Finish)]) -> Result<Vec<bool>, OutboxError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(OutboxError::Database(sqlx::Error::PoolTimedOut));
        }
        self.inner.finish_all(done).await
    }
    async fn release(&self, job: &Job) -> Result<bool, OutboxError> {
        self.inner.release(job).await
    }
    fn wake(&self) {
        self.inner.wake();
    }
    async fn wakeup(&self) -> Result<Wakeup, OutboxError> {
        self.inner.wakeup().await
    }
    async fn job(&self, operation_key: &str) -> Result<Option<JobRecord>, OutboxError> {
        self.inner.job(operation_key).await
    }
    async fn attempts(
        &self,
        job_id: i64,
    ) -> Result<Vec<oncely_outbox::job::AttemptRecord>, OutboxError> {
        self.inner.attempts(job_id).await
    }
    async fn pending(&self) -> Result<i64, OutboxError> {
        self.inner.pending().await
    }
    async fn prune(&self, older_than: Duration, limit: u32) -> Result<u64, OutboxError> {
        self.inner.prune(older_than, limit).await
    }
    async fn backlog(&self) -> Result<Backlog, OutboxError> {
        self.inner.backlog().await
    }
    async fn list(&self, filter: &JobFilter) -> Result<Vec<JobRecord>, OutboxError> {
        self.inner.list(filter).await
    }
    async fn redrive(&self, operation_key: &str) -> Result<bool, OutboxError> {
        self.inner.redrive(operation_key).await
    }
}

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
    let flaky = FailingFinish {
        inner: store.clone(),
        failures: Arc::new(AtomicU32::new(3)),
        calls: Arc::new(AtomicU32::new(0)),
    };
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
        flaky.failures.load(Ordering::SeqCst),
        0,
        "every injected failure happened"
    );
    assert!(
        flaky.calls.load(Ordering::SeqCst) >= 4,
        "three failures, then success"
    );
    // Past the lease: with the result lost, the jobs would be claimed and sent again now.
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    assert_eq!(worker.drain().await.unwrap(), 0, "nothing left to run");
    for key in &keys {
        let record = store.job(key).await.unwrap().unwrap();
        assert_eq!(record.status, JobStatus::Sent, "{key}");
        assert_eq!(sends.lock().unwrap()[key], 1, "{key} sent exactly once");
    }
}
