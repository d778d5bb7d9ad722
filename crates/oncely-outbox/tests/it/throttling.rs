//! Issue 14, item 1: throttling is not failure. A throttled attempt waits at least as long as
//! the provider asked, spends no attempt of the budget, and holds the kind's other jobs in
//! this worker until then. Before, a 429 was a plain retry after the backoff (seconds, never
//! the `Retry-After`), counted as an attempt, and the kind's other jobs kept being sent.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use oncely_outbox::mail::EmailHandler;
use oncely_outbox::{Delivery, Handler, Job, JobStatus, NewJob, RetryPolicy, Worker, WorkerConfig};
use oncely_testdb::TestDb;

use crate::provider::{FakeApi, accepted, smtp_answering_first};
use crate::support::{Backend, both_stores, enqueue_emails, finished_results, mailer, status};

/// Two attempts of budget: more than two tries show that throttles spend none.
const TWO_ATTEMPTS: RetryPolicy = RetryPolicy {
    base: Duration::from_secs(1),
    max_delay: Duration::from_secs(600),
    max_attempts: 2,
    horizon: Duration::from_secs(3600),
};

/// A kind whose jobs are always done.
struct Done;

impl Handler for Done {
    fn run<'a>(&'a self, _job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(async {
            Delivery::Sent {
                provider_message_id: None,
            }
        })
    }
}

both_stores!(
    a_429_with_retry_after_is_waited_for_holds_the_kind_and_spends_no_attempt,
    smtp_throttling_backs_off_without_spending_the_budget,
);

async fn a_429_with_retry_after_is_waited_for_holds_the_kind_and_spends_no_attempt<S: Backend>(
    store: S,
    _db: TestDb,
) {
    // Two rounds of 429s (3 jobs, then 4), then everything is accepted.
    let api = FakeApi::start(|n| {
        if n < 7 {
            (429, vec!["Retry-After: 120".into()], "{}".into())
        } else {
            accepted(n)
        }
    })
    .await;
    let mailer = mailer(&api.url, Duration::from_secs(5));
    let worker = Worker::new(store.clone(), WorkerConfig::default())
        .handle_with_policy("email", EmailHandler::new(mailer), TWO_ATTEMPTS)
        .handle("other", Done);
    enqueue_emails(&store, &["a", "b", "c"]).await;
    assert_eq!(worker.drain().await.unwrap(), 3);
    assert_eq!(api.requests(), 3);
    for key in ["a", "b", "c"] {
        assert_eq!(finished_results(&store, key).await, ["throttled"], "{key}");
    }

    // Held until the Retry-After: a new email job waits, another kind runs on.
    enqueue_emails(&store, &["d"]).await;
    let other = NewJob::new("other:1", "other", serde_json::json!({}));
    store.enqueue_with_business_row(other, true).await.unwrap();
    assert_eq!(worker.drain().await.unwrap(), 1, "only the other kind");
    assert_eq!(status(&store, "other:1").await, JobStatus::Sent);
    store.clock().advance(Duration::from_secs(119));
    assert_eq!(worker.drain().await.unwrap(), 0, "still held");
    assert_eq!(api.requests(), 3, "nothing sent while held");
    assert_eq!(status(&store, "d").await, JobStatus::Pending);

    // At 120 s: all four are due and throttled again; at 240 s they go through.
    store.clock().advance(Duration::from_secs(1));
    assert_eq!(worker.drain().await.unwrap(), 4);
    assert_eq!(api.requests(), 7);
    store.clock().advance(Duration::from_secs(119));
    assert_eq!(worker.drain().await.unwrap(), 0, "held again");
    store.clock().advance(Duration::from_secs(1));
    assert_eq!(worker.drain().await.unwrap(), 4);
    assert_eq!(api.requests(), 11);
    for key in ["a", "b", "c"] {
        assert_eq!(status(&store, key).await, JobStatus::Sent, "{key}");
        // Three attempts on a budget of two: the throttled ones spent nothing.
        assert_eq!(
            finished_results(&store, key).await,
            ["throttled", "throttled", "sent"],
            "{key}"
        );
    }
    assert_eq!(finished_results(&store, "d").await, ["throttled", "sent"]);
}

async fn smtp_throttling_backs_off_without_spending_the_budget<S: Backend>(store: S, _db: TestDb) {
    let policy = RetryPolicy {
        base: Duration::from_millis(10),
        max_delay: Duration::from_millis(40),
        ..TWO_ATTEMPTS
    };
    let addr = smtp_answering_first("RCPT", "451 4.7.1 Rate limited, try later", 4).await;
    let mailer = mailer(&format!("smtp://{addr}"), Duration::from_secs(5));
    let worker = Worker::new(store.clone(), WorkerConfig::default()).handle_with_policy(
        "email",
        EmailHandler::new(mailer),
        policy,
    );
    enqueue_emails(&store, &["a"]).await;
    for _ in 0..10 {
        worker.drain().await.unwrap();
        if status(&store, "a").await != JobStatus::Pending {
            break;
        }
        store.clock().advance(policy.max_delay);
    }
    assert_eq!(status(&store, "a").await, JobStatus::Sent);
    assert_eq!(
        finished_results(&store, "a").await,
        ["throttled", "throttled", "throttled", "throttled", "sent"]
    );
}
