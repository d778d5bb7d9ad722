//! What every job store does, on PostgreSQL and SQLite.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use oncely_outbox::store::{Finish, JobFilter};
use oncely_outbox::{AttemptResult, Enqueued, Job, JobStatus, NewJob};
use oncely_testdb::TestDb;
use serde_json::json;

use crate::support::{Backend, LEASE, both_stores, kinds, listed};

fn job(key: &str) -> NewJob {
    NewJob::new(key, "email", json!({"n": key}))
}

fn sent() -> Finish {
    Finish::sent(Some("p-1".into()))
}

/// Enqueues (and commits) `job`.
async fn enqueue<S: Backend>(store: &S, job: NewJob) -> Enqueued {
    store.enqueue_with_business_row(job, true).await.unwrap()
}

/// Claims up to `limit` jobs of `kind` for `worker`.
async fn claim<S: Backend>(
    store: &S,
    worker: &str,
    kind: &str,
    limit: u32,
    lease: Duration,
) -> Vec<Job> {
    store
        .claim(worker, &kinds(&[kind]), limit, lease)
        .await
        .unwrap()
}

/// Claims the one due email job for `worker` under the usual lease.
async fn claim_one<S: Backend>(store: &S, worker: &str) -> Job {
    claim(store, worker, "email", 1, LEASE).await.remove(0)
}

both_stores!(
    enqueueing_the_same_intent_twice_is_a_no_op_that_says_so,
    a_rolled_back_business_transaction_enqueues_nothing,
    concurrent_workers_claim_every_job_exactly_once,
    a_leased_job_is_not_claimed_again_until_its_lease_ends,
    an_expired_lease_lets_another_worker_take_the_job_and_fences_out_the_first,
    one_batch_finish_records_each_result_and_fences_each_job,
    release_hands_a_job_back_without_counting_the_attempt,
    a_retry_waits_for_its_delay,
    only_the_requested_kinds_are_claimed,
    sent_jobs_keep_their_attempt_history,
    dead_jobs_are_listed_with_their_reason_and_redriven_with_the_same_key,
    pruning_removes_only_finished_jobs_past_their_retention_in_batches,
    a_frozen_payload_is_written_once_under_the_claim_s_lease_and_comes_with_every_later_claim,
    a_record_carries_its_times_and_its_whole_history_across_re_drives,
    a_partitioned_claim_takes_each_partition_s_room_oldest_first,
    a_finish_writes_its_follow_ups_once_and_only_while_it_owns_the_job,
);

async fn enqueueing_the_same_intent_twice_is_a_no_op_that_says_so<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let first = enqueue(&store, job("signup:1")).await;
    assert!(matches!(first, Enqueued::Inserted(_)));
    let again = enqueue(&store, job("signup:1")).await;
    assert_eq!(again, Enqueued::AlreadyExists);
    assert_eq!(store.pending().await.unwrap(), 1);
}

async fn a_rolled_back_business_transaction_enqueues_nothing<S: Backend>(store: S, _db: TestDb) {
    store
        .enqueue_with_business_row(job("k"), false)
        .await
        .unwrap();
    assert_eq!(store.business_rows().await, 0);
    assert!(store.job("k").await.unwrap().is_none());
}

async fn concurrent_workers_claim_every_job_exactly_once<S: Backend>(store: S, _db: TestDb) {
    for i in 0..60 {
        enqueue(&store, job(&format!("k{i}"))).await;
    }
    let workers = (0..4).map(|w| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let jobs = store
                    .claim(&format!("w{w}"), &kinds(&["email"]), 5, LEASE)
                    .await
                    .unwrap();
                if jobs.is_empty() {
                    return mine;
                }
                for job in jobs {
                    assert!(store.finish(&job, &sent()).await.unwrap());
                    mine.push(job.id);
                }
            }
        })
    });
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), 60, "every job ran once");
    assert_eq!(unique.len(), 60, "no job ran twice");
}

async fn a_leased_job_is_not_claimed_again_until_its_lease_ends<S: Backend>(store: S, _db: TestDb) {
    enqueue(&store, job("k")).await;
    let claimed = claim(&store, "a", "email", 10, LEASE).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].attempt, 1);
    assert!(claim(&store, "b", "email", 10, LEASE).await.is_empty());
}

/// A new job `key` claimed by worker `a` for 100 ms, and once that lease is over by worker `b`:
/// both claims.
async fn claimed_again<S: Backend>(store: &S, key: &str) -> (Job, Job) {
    enqueue(store, job(key)).await;
    let first = claim(store, "a", "email", 1, Duration::from_millis(100))
        .await
        .remove(0);
    store.clock().advance(Duration::from_millis(200));
    (first, claim_one(store, "b").await)
}

async fn an_expired_lease_lets_another_worker_take_the_job_and_fences_out_the_first<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let (first, second) = claimed_again(&store, "k").await;
    assert_eq!(second.id, first.id);
    assert_eq!(second.attempt, 2);
    assert_eq!(
        second.delivery_key, first.delivery_key,
        "the delivery key is stable across attempts"
    );
    assert!(
        !store.finish(&first, &sent()).await.unwrap(),
        "the first worker's lease is gone"
    );
    assert!(store.finish(&second, &sent()).await.unwrap());
    let attempts = store.attempts(first.id).await.unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].result.as_deref(), Some("abandoned"));
    assert_eq!(
        (attempts[1].worker.as_str(), attempts[1].result.as_deref()),
        ("b", Some("sent"))
    );
}

async fn release_hands_a_job_back_without_counting_the_attempt<S: Backend>(store: S, _db: TestDb) {
    enqueue(&store, job("k")).await;
    let claimed = claim_one(&store, "a").await;
    assert!(store.release(&claimed).await.unwrap());
    let again = claim_one(&store, "b").await;
    assert_eq!(again.attempt, 1);
    assert!(
        store
            .attempts(again.id)
            .await
            .unwrap()
            .iter()
            .all(|a| a.worker == "b")
    );
}

async fn a_retry_waits_for_its_delay<S: Backend>(store: S, _db: TestDb) {
    enqueue(&store, job("k")).await;
    let claimed = claim_one(&store, "a").await;
    let retry = Finish::retry(
        AttemptResult::Retry,
        Duration::from_millis(300),
        "451 try later".into(),
    );
    assert!(store.finish(&claimed, &retry).await.unwrap());
    assert!(claim(&store, "a", "email", 1, LEASE).await.is_empty());
    store.clock().advance(Duration::from_millis(400));
    let again = claim(&store, "a", "email", 1, LEASE).await;
    assert_eq!(again[0].attempt, 2);
    let record = store.job("k").await.unwrap().unwrap();
    assert_eq!(record.last_error.as_deref(), Some("451 try later"));
}

async fn only_the_requested_kinds_are_claimed<S: Backend>(store: S, _db: TestDb) {
    enqueue(&store, NewJob::new("a", "charge", json!({}))).await;
    enqueue(&store, NewJob::new("b", "email", json!({}))).await;
    let claimed = claim(&store, "w", "charge", 10, LEASE).await;
    assert_eq!(
        claimed.iter().map(|j| j.kind.as_str()).collect::<Vec<_>>(),
        ["charge"]
    );
}

async fn sent_jobs_keep_their_attempt_history<S: Backend>(store: S, _db: TestDb) {
    enqueue(&store, job("k")).await;
    let claimed = claim_one(&store, "a").await;
    store.finish(&claimed, &sent()).await.unwrap();
    let record = store.job("k").await.unwrap().unwrap();
    assert_eq!(record.status, JobStatus::Sent);
    assert_eq!(record.provider_message_id.as_deref(), Some("p-1"));
    assert!(claim(&store, "a", "email", 1, LEASE).await.is_empty());
    assert_eq!(store.pending().await.unwrap(), 0);
}

async fn dead_jobs_are_listed_with_their_reason_and_redriven_with_the_same_key<S: Backend>(
    store: S,
    _db: TestDb,
) {
    enqueue(
        &store,
        NewJob::new("invoice:1:finalize", "invoice", json!({})),
    )
    .await;
    enqueue(&store, job("mail:1")).await;
    let claimed = claim(&store, "w", "invoice", 1, LEASE).await.remove(0);
    let dead = Finish::dead(AttemptResult::Dead, "card declined".into());
    store.finish(&claimed, &dead).await.unwrap();

    let dead_jobs = listed(&store, JobStatus::Dead).await;
    assert_eq!(dead_jobs.len(), 1);
    assert_eq!(dead_jobs[0].last_error.as_deref(), Some("card declined"));
    let invoices = store
        .list(&JobFilter {
            kind: Some("invoice".into()),
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        invoices
            .iter()
            .map(|j| j.operation_key.as_str())
            .collect::<Vec<_>>(),
        ["invoice:1:finalize"]
    );
    assert_eq!(store.list(&JobFilter::default()).await.unwrap().len(), 2);

    assert!(
        !store.redrive("mail:1").await.unwrap(),
        "only dead jobs are re-driven"
    );
    assert!(store.redrive("invoice:1:finalize").await.unwrap());
    let again = claim(&store, "w", "invoice", 1, LEASE).await.remove(0);
    assert_eq!(
        again.delivery_key, claimed.delivery_key,
        "the same key goes downstream again"
    );
    assert_eq!(again.attempt, 1, "a fresh attempt budget");
    assert_eq!(
        store.attempts(again.id).await.unwrap().len(),
        2,
        "the history is kept"
    );
}

async fn pruning_removes_only_finished_jobs_past_their_retention_in_batches<S: Backend>(
    store: S,
    _db: TestDb,
) {
    for i in 0..5 {
        enqueue(&store, job(&format!("done:{i}"))).await;
    }
    for claimed in claim(&store, "w", "email", 5, LEASE).await {
        store.finish(&claimed, &sent()).await.unwrap();
    }
    enqueue(&store, job("waiting")).await;
    assert_eq!(
        store.prune(Duration::from_secs(3600), 10).await.unwrap(),
        0,
        "within retention: kept"
    );
    store.clock().advance(Duration::from_millis(30));
    assert_eq!(
        store.prune(Duration::from_millis(10), 2).await.unwrap(),
        2,
        "one bounded batch"
    );
    assert_eq!(store.prune(Duration::from_millis(10), 10).await.unwrap(), 3);
    assert_eq!(store.prune(Duration::from_millis(10), 10).await.unwrap(), 0);
    assert!(
        store.job("waiting").await.unwrap().is_some(),
        "pending jobs are never pruned"
    );
    assert!(store.job("done:0").await.unwrap().is_none());
}

async fn one_batch_finish_records_each_result_and_fences_each_job<S: Backend>(
    store: S,
    _db: TestDb,
) {
    for key in ["a", "b", "c"] {
        enqueue(&store, job(key)).await;
    }
    let first = claim(&store, "w1", "email", 3, Duration::from_millis(100)).await;
    assert_eq!(first.len(), 3);
    store.clock().advance(Duration::from_millis(200));
    // Another worker takes "c" over after w1's lease ended; w1 still records all three.
    let taken = claim_one(&store, "w2").await;
    let retry = Finish::retry(
        AttemptResult::Retry,
        Duration::from_secs(60),
        "451 try later".into(),
    );
    let dead = Finish::dead(AttemptResult::Dead, "550 no such user".into());
    let outcomes = [sent(), retry, dead];
    let done: Vec<_> = first.iter().zip(&outcomes).collect();
    let owned = store.finish_all(&done).await.unwrap();
    let expected: Vec<bool> = first.iter().map(|j| j.id != taken.id).collect();
    assert_eq!(owned, expected, "only the job taken over is fenced out");
    for (claimed, outcome) in first.iter().zip(&outcomes) {
        let record = store.job(&claimed.operation_key).await.unwrap().unwrap();
        let attempts = store.attempts(claimed.id).await.unwrap();
        if claimed.id == taken.id {
            assert_eq!(record.status, JobStatus::Pending, "still w2's");
            assert_eq!(
                attempts.last().unwrap().result,
                None,
                "w2's attempt is open"
            );
            continue;
        }
        assert_eq!(record.status, outcome.status);
        assert_eq!(record.last_error, outcome.error);
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].result.as_deref(), Some(outcome.result.as_str()));
        assert_eq!(attempts[0].error, outcome.error);
    }
    assert!(store.finish_all(&[]).await.unwrap().is_empty());
    assert!(store.finish(&taken, &sent()).await.unwrap());
}

/// Issue 14, item 3: what the first attempt froze is written once (the first writer wins),
/// only by the claim that owns the job, and every later claim of the job carries it.
async fn a_frozen_payload_is_written_once_under_the_claim_s_lease_and_comes_with_every_later_claim<
    S: Backend,
>(
    store: S,
    _db: TestDb,
) {
    let first_payload = json!({ "to": "old@example.com", "link_base": "https://a.example" });
    enqueue(&store, job("k")).await;
    let first = claim(&store, "a", "email", 1, Duration::from_millis(100))
        .await
        .remove(0);
    assert_eq!(
        first.frozen, None,
        "nothing frozen before the first attempt"
    );
    assert_eq!(
        store.freeze(&first, &first_payload).await.unwrap(),
        Some(first_payload.clone())
    );
    let other = json!({ "to": "new@example.com" });
    assert_eq!(
        store.freeze(&first, &other).await.unwrap(),
        Some(first_payload.clone()),
        "written once: a second write returns the first value"
    );

    // The lease ends and another worker takes the job: it gets the frozen value, cannot
    // replace it, and the first claim can no longer write at all.
    store.clock().advance(Duration::from_millis(200));
    let second = claim_one(&store, "b").await;
    assert_eq!(second.frozen, Some(first_payload.clone()));
    assert_eq!(
        store.freeze(&second, &other).await.unwrap(),
        Some(first_payload.clone())
    );
    assert_eq!(
        store.freeze(&first, &other).await.unwrap(),
        None,
        "fenced: the first claim's lease token no longer owns the job"
    );
    let unknown = Finish::retry(AttemptResult::Unknown, Duration::ZERO, "timeout".into());
    assert!(store.finish(&second, &unknown).await.unwrap());
    let third = claim_one(&store, "c").await;
    assert_eq!(third.frozen, Some(first_payload.clone()));
    store.finish(&third, &sent()).await.unwrap();
    assert_eq!(
        store.freeze(&third, &other).await.unwrap(),
        None,
        "a finished job is never frozen again"
    );
    let record = store.job("k").await.unwrap().unwrap();
    assert_eq!(record.frozen, Some(first_payload));

    // A claim whose lease ended before anything was frozen cannot freeze the first value.
    let (stale, owner) = claimed_again(&store, "k2").await;
    assert_eq!(store.freeze(&stale, &other).await.unwrap(), None);
    assert_eq!(owner.frozen, None);
    assert_eq!(store.job("k2").await.unwrap().unwrap().frozen, None);
}

/// A moment to the millisecond (SQLite keeps milliseconds, PostgreSQL microseconds).
fn ms(at: time::OffsetDateTime) -> i128 {
    at.unix_timestamp_nanos() / 1_000_000
}

/// Issue 15, item 5: operators see when a job was enqueued, is due, died, was re-driven and
/// sent, when each attempt started and ended, and every attempt of its life (a re-drive
/// numbers them from 1 again, but keeps them); a job is found by its id too.
async fn a_record_carries_its_times_and_its_whole_history_across_re_drives<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let enqueued_at = store.clock().now();
    enqueue(&store, NewJob::new("invoice:7", "invoice", json!({}))).await;
    let record = store.job("invoice:7").await.unwrap().unwrap();
    assert_eq!(ms(record.created_at), ms(enqueued_at));
    assert_eq!(ms(record.run_after), ms(enqueued_at), "due at once");
    assert_eq!(
        (record.sent_at, record.dead_at, record.redriven_at),
        (None, None, None)
    );
    assert_eq!(record.all_attempts, 0);

    let first = claim(&store, "w", "invoice", 1, LEASE).await.remove(0);
    store.clock().advance(Duration::from_millis(200));
    let died_at = store.clock().now();
    store
        .finish(
            &first,
            &Finish::dead(AttemptResult::Dead, "declined".into()),
        )
        .await
        .unwrap();
    let dead = store.job_by_id(first.id).await.unwrap().unwrap();
    assert_eq!(dead.operation_key, "invoice:7", "found by its id");
    assert_eq!(dead.status, JobStatus::Dead);
    assert_eq!(dead.dead_at.map(ms), Some(ms(died_at)));
    assert!(store.job_by_id(first.id + 1000).await.unwrap().is_none());

    store.clock().advance(Duration::from_millis(300));
    let redriven_at = store.clock().now();
    assert!(store.redrive("invoice:7").await.unwrap());
    let redriven = store.job("invoice:7").await.unwrap().unwrap();
    assert_eq!(redriven.redriven_at.map(ms), Some(ms(redriven_at)));
    assert_eq!(ms(redriven.run_after), ms(redriven_at), "due now");
    assert_eq!(redriven.dead_at, None);
    assert_eq!((redriven.attempts, redriven.all_attempts), (0, 1));

    let second = claim(&store, "w2", "invoice", 1, LEASE).await.remove(0);
    store.clock().advance(Duration::from_millis(100));
    let sent_at = store.clock().now();
    store.finish(&second, &sent()).await.unwrap();
    let done = store.job("invoice:7").await.unwrap().unwrap();
    assert_eq!(done.sent_at.map(ms), Some(ms(sent_at)));
    assert_eq!((done.attempts, done.all_attempts), (1, 2));
    let listed = store.list(&JobFilter::default()).await.unwrap();
    assert_eq!(listed[0].all_attempts, 2);

    let attempts = store.attempts(first.id).await.unwrap();
    let numbers: Vec<i32> = attempts.iter().map(|a| a.attempt).collect();
    assert_eq!(
        numbers,
        [1, 1],
        "a re-drive numbers from 1 again, and keeps the history"
    );
    assert_eq!(ms(attempts[0].started_at), ms(enqueued_at));
    assert_eq!(attempts[0].finished_at.map(ms), Some(ms(died_at)));
    assert_eq!(ms(attempts[1].started_at), ms(redriven_at));
    assert_eq!(attempts[1].finished_at.map(ms), Some(ms(sent_at)));
    assert_eq!(attempts[1].worker, "w2");
}

/// Claims up to `limit` email jobs, at most `per` of a partition, `running` of each running.
async fn claim_by_partition<S: Backend>(
    store: &S,
    limit: u32,
    per: u32,
    running: &[(&str, u32)],
) -> Vec<Job> {
    let running: HashMap<String, u32> =
        running.iter().map(|(p, n)| ((*p).to_owned(), *n)).collect();
    store
        .claim_partitioned("w", "email", limit, per, &running, LEASE)
        .await
        .unwrap()
}

/// The partitions of `jobs`, counted (`-`: none).
fn per_partition(jobs: &[Job]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for job in jobs {
        let p = job.partition.clone().unwrap_or_else(|| "-".into());
        *counts.entry(p).or_default() += 1;
    }
    counts
}

async fn a_partitioned_claim_takes_each_partition_s_room_oldest_first<S: Backend>(
    store: S,
    _db: TestDb,
) {
    // Oldest first: a1..a5, then b1, b2, n1..n3 (no partition), c1; one of another kind.
    let mut keys = Vec::new();
    for (partition, n) in [(Some("a"), 5), (Some("b"), 2), (None, 3), (Some("c"), 1)] {
        for i in 1..=n {
            let key = format!("{}{i}", partition.unwrap_or("n"));
            let mut new = job(&key);
            if let Some(p) = partition {
                new = new.partition(p);
            }
            enqueue(&store, new).await;
            keys.push(key);
            store.clock().advance(Duration::from_millis(10));
        }
    }
    enqueue(
        &store,
        NewJob::new("other", "charge", json!({})).partition("a"),
    )
    .await;
    let record = store.job("a1").await.unwrap().unwrap();
    assert_eq!(
        record.partition.as_deref(),
        Some("a"),
        "the record names it"
    );

    // The overall limit takes the oldest: a partition gets at most its room of them.
    let two = claim_by_partition(&store, 2, 3, &[("a", 2)]).await;
    let two_keys: Vec<_> = two.iter().map(|j| j.operation_key.as_str()).collect();
    assert_eq!(two_keys, ["a1", "b1"], "a had room for one");
    assert_eq!(two[0].partition.as_deref(), Some("a"), "the job names it");

    // a is full (3 running of 3): none of its backlog; every other partition up to its room;
    // jobs without a partition up to the limit.
    let rest = claim_by_partition(&store, 100, 3, &[("a", 3), ("b", 2)]).await;
    assert_eq!(
        per_partition(&rest),
        HashMap::from([("b".into(), 1), ("-".into(), 3), ("c".into(), 1)]),
        "b: 3 - 2 running; a: none"
    );
    assert!(rest.iter().all(|j| j.kind == "email"), "its kind only");
    // Nothing left for a full partition; then a finished one frees its room.
    assert!(
        claim_by_partition(&store, 100, 3, &[("a", 3)])
            .await
            .is_empty()
    );
    let a = claim_by_partition(&store, 100, 3, &[("a", 1)]).await;
    let a_keys: Vec<_> = a.iter().map(|j| j.operation_key.as_str()).collect();
    assert_eq!(a_keys, ["a2", "a3"], "its oldest, up to its room");
    // A kind claimed without a per-partition limit ignores partitions.
    let other = claim(&store, "w", "charge", 10, LEASE).await;
    assert_eq!(other.len(), 1);

    // A partition key is data, whatever it holds (JSON paths, quotes, SQL): its count is found.
    let odd = r#"x."[$]' OR 1=1 --"#;
    for i in 0..2 {
        enqueue(&store, job(&format!("odd{i}")).partition(odd)).await;
    }
    // (a's two left are held back by a's count.)
    let full = [(odd, 1), ("a", 1)];
    assert!(claim_by_partition(&store, 100, 1, &full).await.is_empty());
    let one = claim_by_partition(&store, 100, 1, &[("a", 1)]).await;
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].partition.as_deref(), Some(odd));
}

async fn a_finish_writes_its_follow_ups_once_and_only_while_it_owns_the_job<S: Backend>(
    store: S,
    _db: TestDb,
) {
    enqueue(&store, job("taken")).await;
    enqueue(
        &store,
        NewJob::new("event:exists", "event", json!({"old": true})),
    )
    .await;
    let at = store.clock().now() + Duration::from_secs(3600);
    let follow_up = |key: &str| {
        NewJob::new(format!("event:{key}"), "event", json!({"of": key}))
            .partition("endpoint-1")
            .not_after(at)
    };
    // Its lease ends and another worker takes it: the late finish writes nothing.
    let first = claim(&store, "a", "email", 1, Duration::from_millis(100))
        .await
        .remove(0);
    assert_eq!(first.operation_key, "taken");
    store.clock().advance(Duration::from_millis(200));
    let second = claim(&store, "b", "email", 1, LEASE).await.remove(0);
    assert_eq!(second.id, first.id);
    let mut late = sent();
    late.follow_ups = vec![follow_up("taken")];
    assert!(!store.finish(&first, &late).await.unwrap());
    assert!(
        store.job("event:taken").await.unwrap().is_none(),
        "no follow-up without the finish"
    );

    // An owned finish writes them with the status (one whose key exists is left as it is).
    enqueue(&store, job("mine")).await;
    let mine = claim(&store, "a", "email", 1, LEASE).await.remove(0);
    assert_eq!(mine.operation_key, "mine");
    let mut finish = sent();
    finish.follow_ups = vec![
        follow_up("mine"),
        NewJob::new("event:exists", "event", json!({"new": true})),
    ];
    let results = store
        .finish_all(&[(&mine, &finish), (&second, &sent())])
        .await
        .unwrap();
    assert_eq!(results, [true, true]);
    let written = store.job("event:mine").await.unwrap().unwrap();
    assert_eq!(written.status, JobStatus::Pending);
    assert_eq!(written.kind, "event");
    assert_eq!(written.payload, json!({"of": "mine"}));
    assert_eq!(written.partition.as_deref(), Some("endpoint-1"));
    assert_ne!(written.delivery_key, mine.delivery_key, "a job of its own");
    assert_eq!(
        store.job("event:exists").await.unwrap().unwrap().payload,
        json!({"old": true}),
        "an existing key is not overwritten"
    );
    let events = claim_events(&store).await;
    assert_eq!(events.len(), 2, "due now: {events:?}");
    let claimed = events.iter().find(|j| j.operation_key == "event:mine");
    let claimed = claimed.unwrap();
    assert_eq!(
        claimed.not_after.map(|t| t.unix_timestamp()),
        Some(at.unix_timestamp()),
        "its deadline kept"
    );
    assert!(
        store.job("event:taken").await.unwrap().is_none(),
        "none for the other job's finish"
    );

    // Recorded again (a retried write whose first try went through): nothing doubles.
    assert!(!store.finish(&mine, &finish).await.unwrap());
    let filter = JobFilter {
        kind: Some("event".into()),
        ..JobFilter::default()
    };
    assert_eq!(store.list(&filter).await.unwrap().len(), 2);
}

async fn claim_events<S: Backend>(store: &S) -> Vec<Job> {
    store
        .claim("w", &kinds(&["event"]), 10, LEASE)
        .await
        .unwrap()
}
