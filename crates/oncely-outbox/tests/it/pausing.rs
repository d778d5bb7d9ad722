//! Issue 14, item 2: bad credentials pause, they do not kill. A provider that refuses our API
//! key (401) pauses the kind in the worker: its jobs stay pending and spend no attempt, one
//! probe job goes out per interval, and the kind resumes by itself once the provider accepts.
//! Before, each job the provider refused was dead after one attempt.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use oncely_outbox::mail::{Email, EmailHandler, from_url};
use oncely_outbox::{JobStatus, NewJob, Worker, WorkerConfig};
use oncely_testdb::TestDb;

use crate::provider::{FakeApi, accepted};
use crate::support::{Backend, both_stores};

/// `KindOptions::probe_interval`'s default.
const INTERVAL: Duration = Duration::from_secs(30);

fn email_job(key: &str) -> NewJob {
    let email = Email {
        from: "oncely@localhost".into(),
        to: format!("{key}@example.com"),
        subject: "Hello".into(),
        text: "hi".into(),
    };
    NewJob::new(key, "email", serde_json::to_value(email).unwrap())
}

async fn results<S: Backend>(store: &S, key: &str) -> Vec<String> {
    let id = store.job(key).await.unwrap().unwrap().id;
    let attempts = store.attempts(id).await.unwrap();
    attempts.into_iter().filter_map(|a| a.result).collect()
}

both_stores!(a_refused_kind_pauses_is_probed_once_per_interval_and_resumes_by_itself);

async fn a_refused_kind_pauses_is_probed_once_per_interval_and_resumes_by_itself<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let accepting = Arc::new(AtomicBool::new(false));
    let api = {
        let accepting = accepting.clone();
        FakeApi::start(move |n| {
            if accepting.load(Ordering::SeqCst) {
                accepted(n)
            } else {
                let body = r#"{"statusCode":401,"message":"API key is invalid"}"#;
                (401, vec![], body.into())
            }
        })
        .await
    };
    let mailer = from_url(&api.url, None, Duration::from_secs(5), None).unwrap();
    let worker = Worker::new(store.clone(), WorkerConfig::default())
        .handle("email", EmailHandler::new(mailer));
    for key in ["a", "b", "c"] {
        store
            .enqueue_with_business_row(email_job(key), true)
            .await
            .unwrap();
    }
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
        assert_eq!(results(&store, key).await, ["paused"]);
    }

    // Paused: a new job waits with the others; nothing goes out until the interval ends.
    store
        .enqueue_with_business_row(email_job("d"), true)
        .await
        .unwrap();
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
        let results = results(&store, key).await;
        assert_eq!(results.last().map(String::as_str), Some("sent"), "{key}");
        assert!(
            results[..results.len() - 1].iter().all(|r| r == "paused"),
            "{results:?}"
        );
    }
    assert_eq!(store.pending().await.unwrap(), 0);
}
