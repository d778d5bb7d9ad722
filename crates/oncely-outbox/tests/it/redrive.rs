//! Issue 14, items 2 and 8: re-driving dead jobs. A re-driven job gets a fresh horizon (before,
//! it kept its first `created_at`, so its first failure after the re-drive was dead at once);
//! dead jobs are found and re-driven in bulk by kind, time and reason, each keeping its
//! delivery key, and the dry run counts those the provider may no longer deduplicate.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use oncely_outbox::store::postgres::PgJobStore;
use oncely_outbox::store::sqlite::SqliteJobStore;
use oncely_outbox::store::{BulkRedrive, DeadFilter, Finish, PROVIDER_DEDUPE_WINDOW};
use oncely_outbox::{
    AttemptResult, Delivery, Handler, Job, JobStatus, JobStore, NewJob, Worker, WorkerConfig,
};
use oncely_testdb::TestDb;
use serde_json::json;

use crate::support::{Backend, LEASE, both_stores, kinds};

both_stores!(
    a_re_driven_job_gets_a_fresh_horizon,
    dead_jobs_are_counted_sampled_and_redriven_in_bulk_by_kind_time_and_reason,
    a_bulk_redrive_until_the_dry_runs_moment_leaves_out_jobs_that_died_after_it,
    a_bulk_redrive_that_expects_a_count_changes_nothing_unless_exactly_that_many_match,
    no_concurrent_change_slips_between_a_bulk_redrives_count_and_its_redrive,
);

/// Permanent on its first run ("550"), a plain retry ("503") on every later one.
struct DiesThenFails(Arc<AtomicU32>);

impl Handler for DiesThenFails {
    fn run<'a>(&'a self, _job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        let first = self.0.fetch_add(1, Ordering::SeqCst) == 0;
        Box::pin(async move {
            if first {
                Delivery::Permanent("550 mailbox unavailable".into())
            } else {
                Delivery::Retry("503 try later".into())
            }
        })
    }
}

async fn a_re_driven_job_gets_a_fresh_horizon<S: Backend>(store: S, _db: TestDb) {
    let runs = Arc::new(AtomicU32::new(0));
    // The default policy: a 23 h horizon.
    let worker =
        Worker::new(store.clone(), WorkerConfig::default()).handle("x", DiesThenFails(runs));
    let job = NewJob::new("x:1", "x", json!({}));
    store.enqueue_with_business_row(job, true).await.unwrap();
    assert_eq!(worker.drain().await.unwrap(), 1);
    assert_eq!(
        store.job("x:1").await.unwrap().unwrap().status,
        JobStatus::Dead
    );

    // An operator re-drives it the next day, after the cause was fixed.
    store.clock().advance(Duration::from_secs(30 * 3600));
    assert!(store.redrive("x:1").await.unwrap());
    assert_eq!(worker.drain().await.unwrap(), 1);
    let record = store.job("x:1").await.unwrap().unwrap();
    assert_eq!(
        record.status,
        JobStatus::Pending,
        "one failure after a re-drive is retried: {:?}",
        record.last_error
    );
    assert_eq!(record.last_error.as_deref(), Some("503 try later"));
}

/// Enqueues `key` of `kind` and claims it (alone).
async fn claimed<S: Backend>(store: &S, key: &str, kind: &str) -> Job {
    let job = NewJob::new(key, kind, json!({}));
    store.enqueue_with_business_row(job, true).await.unwrap();
    let mut jobs = store.claim("w", &kinds(&[kind]), 1, LEASE).await.unwrap();
    assert_eq!(jobs.len(), 1);
    jobs.remove(0)
}

/// Enqueues `key` of `kind` and lets it die of `reason`; returns its delivery key.
async fn dead<S: Backend>(store: &S, key: &str, kind: &str, reason: &str) -> uuid::Uuid {
    let job = claimed(store, key, kind).await;
    let finish = Finish::dead(AttemptResult::Dead, reason.into());
    assert!(store.finish(&job, &finish).await.unwrap());
    job.delivery_key
}

fn filter(kind: Option<&str>, reason: Option<&str>) -> DeadFilter {
    DeadFilter {
        kind: kind.map(Into::into),
        reason_contains: reason.map(Into::into),
        ..DeadFilter::default()
    }
}

async fn dead_jobs_are_counted_sampled_and_redriven_in_bulk_by_kind_time_and_reason<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let t0 = store.now();
    let key_1 = dead(&store, "email:1", "email", "HTTP 401 Unauthorized: bad key").await;
    dead(&store, "charge:1", "charge", "HTTP 401 Unauthorized").await;
    store.clock().advance(Duration::from_secs(2 * 3600));
    dead(&store, "email:2", "email", "550 no such user").await;
    // An attempt with an unknown outcome, then a refusal that killed it.
    let job = claimed(&store, "email:3", "email").await;
    let unknown = Finish::retry(AttemptResult::Unknown, Duration::ZERO, "timeout".into());
    assert!(store.finish(&job, &unknown).await.unwrap());
    let again = store
        .claim("w", &kinds(&["email"]), 1, LEASE)
        .await
        .unwrap()
        .remove(0);
    let refused = Finish::dead(AttemptResult::Dead, "http 401: revoked".into());
    assert!(store.finish(&again, &refused).await.unwrap());
    let key_3 = again.delivery_key;
    // Pending with a matching error: never counted, never re-driven.
    let job = claimed(&store, "email:4", "email").await;
    let two_days = Duration::from_secs(48 * 3600);
    let waiting = Finish::retry(AttemptResult::Retry, two_days, "HTTP 401 for now".into());
    assert!(store.finish(&job, &waiting).await.unwrap());

    // A day later: the unknown attempt is past the provider's window.
    store.clock().advance(Duration::from_secs(25 * 3600));
    let window = PROVIDER_DEDUPE_WINDOW;
    let found = store
        .dead_jobs(&filter(None, Some("HTTP 401")), 10, window)
        .await
        .unwrap();
    assert_eq!((found.matching, found.unknown_past_window), (3, 1));
    let keys: Vec<_> = found
        .sample
        .iter()
        .map(|d| d.operation_key.as_str())
        .collect();
    assert_eq!(
        keys,
        ["email:3", "charge:1", "email:1"],
        "most recently dead first"
    );
    assert_eq!(
        found.sample[0].last_error.as_deref(),
        Some("http 401: revoked")
    );
    let one = store
        .dead_jobs(&filter(None, Some("401")), 1, window)
        .await
        .unwrap();
    assert_eq!((one.matching, one.sample.len()), (3, 1));
    let wider = Duration::from_secs(30 * 3600);
    let inside = store
        .dead_jobs(&filter(None, Some("401")), 1, wider)
        .await
        .unwrap();
    assert_eq!(inside.unknown_past_window, 0, "inside a 30 h window");
    let count = |f: DeadFilter| {
        let store = store.clone();
        async move { store.dead_jobs(&f, 0, window).await.unwrap().matching }
    };
    assert_eq!(count(filter(Some("email"), Some("401"))).await, 2);
    assert_eq!(count(filter(Some("email"), None)).await, 3);
    assert_eq!(count(filter(None, None)).await, 4);
    assert_eq!(
        count(filter(None, Some("%"))).await,
        0,
        "a substring, not a LIKE pattern"
    );
    assert_eq!(count(filter(None, Some("UNAUTHORIZED"))).await, 2);
    let since = |hours: i64| DeadFilter {
        since: Some(t0 + time::Duration::hours(hours)),
        ..DeadFilter::default()
    };
    assert_eq!(count(since(1)).await, 2);
    assert_eq!(count(since(0)).await, 4);
    assert_eq!(count(since(3)).await, 0);
    // Counting changed nothing.
    assert_eq!(count(filter(None, None)).await, 4);

    // Re-drive the emails refused with 401: exactly those two, each with its delivery key.
    let redriven = store
        .redrive_dead(&filter(Some("email"), Some("401")), None)
        .await
        .unwrap();
    assert_eq!(redriven, BulkRedrive::Redriven(2));
    for (key, delivery_key) in [("email:1", key_1), ("email:3", key_3)] {
        let record = store.job(key).await.unwrap().unwrap();
        assert_eq!(record.status, JobStatus::Pending, "{key}");
        assert_eq!(
            record.delivery_key, delivery_key,
            "{key} keeps its delivery key"
        );
    }
    for key in ["charge:1", "email:2"] {
        assert_eq!(
            store.job(key).await.unwrap().unwrap().status,
            JobStatus::Dead,
            "{key}"
        );
    }
    let mut due = store
        .claim("w", &kinds(&["email"]), 10, LEASE)
        .await
        .unwrap();
    due.sort_by_key(|j| j.operation_key.clone());
    let now = store.now();
    let fresh = |at: Option<time::OffsetDateTime>| {
        at.is_some_and(|at| (at - now).abs() < time::Duration::milliseconds(1))
    };
    let due: Vec<_> = due
        .iter()
        .map(|j| (j.operation_key.as_str(), j.attempt, fresh(j.redriven_at)))
        .collect();
    assert_eq!(
        due,
        [("email:1", 1, true), ("email:3", 1, true)],
        "due now with a fresh budget and horizon; email:4 still waits"
    );
    assert_eq!(
        store
            .redrive_dead(&DeadFilter::default(), None)
            .await
            .unwrap(),
        BulkRedrive::Redriven(2),
        "the rest"
    );
    assert_eq!(count(filter(None, None)).await, 0);
}

/// The status of each of `keys`.
async fn statuses<S: Backend>(store: &S, keys: &[&str]) -> Vec<JobStatus> {
    let mut statuses = Vec::new();
    for key in keys {
        statuses.push(store.job(key).await.unwrap().unwrap().status);
    }
    statuses
}

/// Review of issue 14, A: `retry --reason-like injected` counted 4 dead jobs, two more died,
/// and `--yes` re-drove 6. A dry run now says when it counted (`as_of`, the store's time); the
/// command it prints bounds the set with `until` at that moment, so jobs that die later stay
/// out.
async fn a_bulk_redrive_until_the_dry_runs_moment_leaves_out_jobs_that_died_after_it<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let window = PROVIDER_DEDUPE_WINDOW;
    let t0 = store.now();
    dead(&store, "email:1", "email", "injected failure").await;
    store.clock().advance(Duration::from_secs(3600));
    dead(&store, "email:2", "email", "injected failure").await;
    let injected = filter(None, Some("injected"));
    let dry = store.dead_jobs(&injected, 10, window).await.unwrap();
    assert_eq!(dry.matching, 2);
    assert!(
        (dry.as_of - store.now()).abs() < time::Duration::milliseconds(1),
        "counted at the store's time: {} against {}",
        dry.as_of,
        store.now()
    );

    // Two more die after the dry run.
    store.clock().advance(Duration::from_secs(1));
    dead(&store, "email:3", "email", "injected failure").await;
    dead(&store, "email:4", "email", "injected failure").await;
    assert_eq!(
        store
            .dead_jobs(&injected, 0, window)
            .await
            .unwrap()
            .matching,
        4
    );
    let until = DeadFilter {
        until: Some(dry.as_of),
        ..injected.clone()
    };
    assert_eq!(
        store.dead_jobs(&until, 10, window).await.unwrap().matching,
        2
    );
    let sample = store.dead_jobs(&until, 10, window).await.unwrap().sample;
    let keys: Vec<_> = sample.iter().map(|d| d.operation_key.as_str()).collect();
    assert_eq!(keys, ["email:2", "email:1"], "the sample is bounded too");
    let between = DeadFilter {
        since: Some(t0 + time::Duration::minutes(30)),
        ..until.clone()
    };
    assert_eq!(
        store.dead_jobs(&between, 0, window).await.unwrap().matching,
        1
    );
    let before = DeadFilter {
        until: Some(t0 - time::Duration::seconds(1)),
        ..injected.clone()
    };
    assert_eq!(
        store.dead_jobs(&before, 0, window).await.unwrap().matching,
        0
    );

    assert_eq!(
        store.redrive_dead(&until, Some(2)).await.unwrap(),
        BulkRedrive::Redriven(2)
    );
    assert_eq!(
        statuses(&store, &["email:1", "email:2", "email:3", "email:4"]).await,
        [
            JobStatus::Pending,
            JobStatus::Pending,
            JobStatus::Dead,
            JobStatus::Dead
        ],
        "the jobs that died after the dry run stay dead"
    );
}

/// Review of issue 14, A: `--expect N` re-drives only if exactly N dead jobs match, and
/// otherwise changes nothing.
async fn a_bulk_redrive_that_expects_a_count_changes_nothing_unless_exactly_that_many_match<
    S: Backend,
>(
    store: S,
    _db: TestDb,
) {
    for key in ["email:1", "email:2", "email:3"] {
        dead(&store, key, "email", "HTTP 401").await;
    }
    dead(&store, "email:4", "email", "550 no such user").await;
    let refused = filter(None, Some("401"));
    for wrong in [0, 2, 4] {
        assert_eq!(
            store.redrive_dead(&refused, Some(wrong)).await.unwrap(),
            BulkRedrive::CountDiffers { matching: 3 },
            "expecting {wrong}"
        );
    }
    let all = ["email:1", "email:2", "email:3", "email:4"];
    assert_eq!(
        statuses(&store, &all).await,
        [JobStatus::Dead; 4],
        "a count that differs changes nothing"
    );
    assert_eq!(
        store
            .job("email:1")
            .await
            .unwrap()
            .unwrap()
            .last_error
            .as_deref(),
        Some("HTTP 401")
    );
    assert_eq!(
        store.redrive_dead(&refused, Some(3)).await.unwrap(),
        BulkRedrive::Redriven(3)
    );
    assert_eq!(
        statuses(&store, &all).await,
        [
            JobStatus::Pending,
            JobStatus::Pending,
            JobStatus::Pending,
            JobStatus::Dead
        ]
    );
    assert_eq!(
        store.redrive_dead(&refused, Some(0)).await.unwrap(),
        BulkRedrive::Redriven(0),
        "none left, as expected"
    );
}

/// Another connection changes the outbox while a bulk re-drive runs.
trait Racing: Backend {
    /// Re-drives `key` by hand in a transaction of its own and, while that transaction is open
    /// (on PostgreSQL the job's row locked, on SQLite the write lock held), starts
    /// `redrive_dead(filter, Some(expect))`; commits the hand re-drive once the bulk one waits
    /// for it, and returns the bulk one's answer.
    fn race(
        &self,
        key: &str,
        filter: DeadFilter,
        expect: u64,
    ) -> impl Future<Output = BulkRedrive> + Send;
}

const BY_HAND: &str =
    "UPDATE oncely_outbox SET status = 'pending', dead_at = NULL WHERE operation_key = $1";

/// Re-drives the dead job `key` by hand in `tx` ([`BY_HAND`]), not yet committed.
async fn redrive_by_hand<DB: sqlx::Database>(tx: &mut sqlx::Transaction<'_, DB>, key: &str)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    sqlx::query(BY_HAND)
        .bind(key)
        .execute(&mut **tx)
        .await
        .unwrap();
}

/// `redrive_dead(filter, Some(expect))` on `store`, in a task of its own.
fn bulk_redrive<S: JobStore + Clone + Send + Sync + 'static>(
    store: &S,
    filter: DeadFilter,
    expect: u64,
) -> tokio::task::JoinHandle<BulkRedrive> {
    let store = store.clone();
    tokio::spawn(async move { store.redrive_dead(&filter, Some(expect)).await.unwrap() })
}

impl Racing for PgJobStore {
    async fn race(&self, key: &str, filter: DeadFilter, expect: u64) -> BulkRedrive {
        let mut by_hand = self.pool().begin().await.unwrap();
        redrive_by_hand(&mut by_hand, key).await;
        let bulk = bulk_redrive(self, filter, expect);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(self.pool())
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the bulk re-drive never waited for the row the hand re-drive holds"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        by_hand.commit().await.unwrap();
        bulk.await.unwrap()
    }
}

impl Racing for SqliteJobStore {
    async fn race(&self, key: &str, filter: DeadFilter, expect: u64) -> BulkRedrive {
        let mut by_hand = self.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
        redrive_by_hand(&mut by_hand, key).await;
        let bulk = bulk_redrive(self, filter, expect);
        // SQLite shows no one waiting for its write lock: give the bulk re-drive the time to
        // count (a store that counted outside its write transaction would count the job the
        // hand re-drive is taking). A store that counts and re-drives in one write transaction
        // answers the same whenever it starts, so this wait cannot make the test fail.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!bulk.is_finished(), "it waits for the write lock");
        by_hand.commit().await.unwrap();
        bulk.await.unwrap()
    }
}

/// Review of issue 14, A: the count `--expect` checks and the re-drive are one transaction.
/// Here another operator re-drives one of the three matching jobs by hand while the bulk
/// re-drive that expects three runs: it must refuse (only two match once it may act), not
/// count three before the change and re-drive two after it.
async fn no_concurrent_change_slips_between_a_bulk_redrives_count_and_its_redrive<S: Racing>(
    store: S,
    _db: TestDb,
) {
    for key in ["email:1", "email:2", "email:3"] {
        dead(&store, key, "email", "HTTP 401").await;
    }
    let refused = filter(None, Some("401"));
    assert_eq!(
        store.race("email:2", refused.clone(), 3).await,
        BulkRedrive::CountDiffers { matching: 2 }
    );
    assert_eq!(
        statuses(&store, &["email:1", "email:2", "email:3"]).await,
        [JobStatus::Dead, JobStatus::Pending, JobStatus::Dead],
        "the bulk re-drive changed nothing"
    );
    assert_eq!(
        store.redrive_dead(&refused, Some(2)).await.unwrap(),
        BulkRedrive::Redriven(2)
    );
}
