//! The conformance suite every `KeyStore` passes: the same cases on PostgreSQL and SQLite.

use std::time::Duration;

use bytes::Bytes;
use oncely::fingerprint::RequestTarget;
use oncely::store::{
    Claim, ClaimRequest, Completion, FencingToken, KeyStore, ManualClock, RecordState,
    StoredResponse, prune_all,
};
use oncely::{Fingerprint, IdempotencyKey, Scope, TenantId};

use crate::support::{Backend, Db, both_stores, new_key, scope, secret};

fn fp(body: &str) -> Fingerprint {
    Fingerprint::of_request(
        &secret(),
        &RequestTarget::route("POST", "/payments"),
        None,
        body.as_bytes(),
        None,
    )
}

fn req<'a>(scope: &'a Scope, fingerprint: &'a Fingerprint, lease_ms: u64) -> ClaimRequest<'a> {
    ClaimRequest {
        scope,
        fingerprint,
        lease: Duration::from_millis(lease_ms),
        retention: Duration::from_secs(3600),
    }
}

fn response(body: &str) -> Completion {
    let mut headers = http::HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    headers.insert("set-cookie", "session=secret".parse().unwrap());
    Completion::Response(StoredResponse::new(
        201,
        &headers,
        Bytes::from(body.to_owned()),
    ))
}

/// The store on a clock that stands still until the test advances it: a lease or a retention
/// period passes at once, and never before the test says so.
fn on_a_manual_clock<S: Backend>(store: S) -> (S, ManualClock) {
    let clock = ManualClock::starting_now();
    (store.with_clock(clock.clone()), clock)
}

fn acquired<T>(claim: Claim<T>) -> FencingToken {
    match claim {
        Claim::Acquired { token, .. } => token,
        other => panic!(
            "expected the key to be acquired, got {:?}",
            other_kind(&other)
        ),
    }
}

fn other_kind<T>(claim: &Claim<T>) -> String {
    match claim {
        Claim::Acquired { .. } => "Acquired".into(),
        Claim::Existing(r) => format!("Existing({:?})", r.state),
        Claim::Busy => "Busy".into(),
    }
}

both_stores!(
    a_new_key_is_acquired_and_then_seen_in_progress,
    fifty_concurrent_claims_acquire_the_key_exactly_once,
    completion_needs_the_current_fencing_token,
    completed_keys_return_their_response_without_unlisted_headers,
    an_expired_lease_is_taken_over_and_the_old_owner_can_no_longer_complete,
    an_expired_lease_is_not_taken_over_by_a_different_request,
    release_frees_the_key_only_for_its_owner,
    renewal_keeps_a_live_owner_and_is_fenced,
    lease_and_retention_are_separate,
    prune_deletes_only_expired_rows_in_bounded_batches,
    a_tombstone_is_kept_and_returned,
    keys_of_different_tenants_and_routes_are_independent,
    a_transactional_claim_commits_with_the_business_change,
    a_rolled_back_transactional_claim_leaves_the_key_free,
    a_transactional_claim_waits_for_a_concurrent_owner_and_sees_its_result,
);

async fn a_new_key_is_acquired_and_then_seen_in_progress<S: Backend>(store: S, _db: Db) {
    let scope = scope(&new_key());
    let fp = fp("a");
    acquired(store.claim(&req(&scope, &fp, 10_000)).await.unwrap());
    match store.claim(&req(&scope, &fp, 10_000)).await.unwrap() {
        Claim::Existing(record) => {
            assert_eq!(record.fingerprint, fp);
            assert_eq!(record.state, RecordState::InProgress { lease_active: true });
        }
        other => panic!("second claim: {}", other_kind(&other)),
    }
}

async fn fifty_concurrent_claims_acquire_the_key_exactly_once<S: Backend>(store: S, _db: Db) {
    let key = new_key();
    let claims = (0..50).map(|_| {
        let store = store.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let (scope, fp) = (scope(&key), fp("a"));
            store.claim(&req(&scope, &fp, 10_000)).await.unwrap()
        })
    });
    let mut won = 0;
    for claim in claims {
        if let Claim::Acquired { .. } = claim.await.unwrap() {
            won += 1;
        }
    }
    assert_eq!(won, 1);
}

async fn completion_needs_the_current_fencing_token<S: Backend>(store: S, _db: Db) {
    let scope = scope(&new_key());
    let fp = fp("a");
    let token = acquired(store.claim(&req(&scope, &fp, 10_000)).await.unwrap());
    assert!(
        !store
            .complete(&scope, FencingToken::new(), &response("x"))
            .await
            .unwrap()
    );
    assert!(
        store
            .complete(&scope, token, &response("ok"))
            .await
            .unwrap()
    );
    // A completed key cannot be completed again, not even by its owner.
    assert!(
        !store
            .complete(&scope, token, &response("again"))
            .await
            .unwrap()
    );
}

async fn completed_keys_return_their_response_without_unlisted_headers<S: Backend>(
    store: S,
    _db: Db,
) {
    let scope = scope(&new_key());
    let fp = fp("a");
    let token = acquired(store.claim(&req(&scope, &fp, 10_000)).await.unwrap());
    store
        .complete(&scope, token, &response(r#"{"id":1}"#))
        .await
        .unwrap();
    let expected = RecordState::Completed(StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: Bytes::from_static(br#"{"id":1}"#),
    });
    assert_eq!(store.get(&scope).await.unwrap().unwrap().state, expected);
    match store.claim(&req(&scope, &fp, 10_000)).await.unwrap() {
        Claim::Existing(record) => assert_eq!(record.state, expected),
        other => panic!("claim after completion: {}", other_kind(&other)),
    }
}

async fn an_expired_lease_is_taken_over_and_the_old_owner_can_no_longer_complete<S: Backend>(
    store: S,
    _db: Db,
) {
    let (store, clock) = on_a_manual_clock(store);
    let scope = scope(&new_key());
    let fp = fp("a");
    let old = acquired(store.claim(&req(&scope, &fp, 100)).await.unwrap());
    clock.advance(Duration::from_millis(150));
    let new = acquired(store.claim(&req(&scope, &fp, 10_000)).await.unwrap());
    assert_ne!(old, new);
    assert!(!store.complete(&scope, old, &response("old")).await.unwrap());
    assert!(!store.release(&scope, old).await.unwrap());
    assert!(store.complete(&scope, new, &response("new")).await.unwrap());
    let Some(record) = store.get(&scope).await.unwrap() else {
        panic!("row gone")
    };
    assert!(matches!(record.state, RecordState::Completed(r) if r.body == "new"));
}

async fn an_expired_lease_is_not_taken_over_by_a_different_request<S: Backend>(store: S, _db: Db) {
    let (store, clock) = on_a_manual_clock(store);
    let scope = scope(&new_key());
    acquired(store.claim(&req(&scope, &fp("a"), 50)).await.unwrap());
    clock.advance(Duration::from_millis(100));
    match store.claim(&req(&scope, &fp("b"), 10_000)).await.unwrap() {
        Claim::Existing(record) => assert_eq!(record.fingerprint, fp("a")),
        other => panic!(
            "a different request took the key over: {}",
            other_kind(&other)
        ),
    }
}

async fn renewal_keeps_a_live_owner_and_is_fenced<S: Backend>(store: S, _db: Db) {
    let (store, clock) = on_a_manual_clock(store);
    let scope = scope(&new_key());
    let fp = fp("a");
    let token = acquired(store.claim(&req(&scope, &fp, 300)).await.unwrap());
    // Renewed well past the first lease: never taken over while renewals keep coming.
    assert!(
        store
            .renew(&scope, token, Duration::from_secs(60))
            .await
            .unwrap()
    );
    clock.advance(Duration::from_millis(400));
    match store.claim(&req(&scope, &fp, 10_000)).await.unwrap() {
        Claim::Existing(record) => {
            assert_eq!(record.state, RecordState::InProgress { lease_active: true });
        }
        other => panic!("a renewed claim was taken over: {}", other_kind(&other)),
    }
    // Another token cannot renew, and neither can the owner once the key is completed.
    assert!(
        !store
            .renew(&scope, FencingToken::new(), Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(
        store
            .complete(&scope, token, &response("done"))
            .await
            .unwrap()
    );
    assert!(
        !store
            .renew(&scope, token, Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(matches!(
        store.get(&scope).await.unwrap().unwrap().state,
        RecordState::Completed(_)
    ));
    // A lapsed, taken-over owner cannot renew its way back.
    let scope = crate::support::scope(&new_key());
    let old = acquired(store.claim(&req(&scope, &fp, 50)).await.unwrap());
    clock.advance(Duration::from_millis(100));
    let new = acquired(store.claim(&req(&scope, &fp, 10_000)).await.unwrap());
    assert!(
        !store
            .renew(&scope, old, Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(
        store
            .renew(&scope, new, Duration::from_secs(60))
            .await
            .unwrap()
    );
}

async fn release_frees_the_key_only_for_its_owner<S: Backend>(store: S, _db: Db) {
    let scope = scope(&new_key());
    let fp = fp("a");
    let token = acquired(store.claim(&req(&scope, &fp, 10_000)).await.unwrap());
    assert!(!store.release(&scope, FencingToken::new()).await.unwrap());
    assert!(store.release(&scope, token).await.unwrap());
    assert!(store.get(&scope).await.unwrap().is_none());
    acquired(store.claim(&req(&scope, &fp, 10_000)).await.unwrap());
}

async fn lease_and_retention_are_separate<S: Backend>(store: S, _db: Db) {
    let (store, clock) = on_a_manual_clock(store);
    let scope = scope(&new_key());
    let fp = fp("a");
    let claim = ClaimRequest {
        scope: &scope,
        fingerprint: &fp,
        lease: Duration::from_millis(50),
        retention: Duration::from_millis(2000),
    };
    let token = acquired(store.claim(&claim).await.unwrap());
    store
        .complete(&scope, token, &response("ok"))
        .await
        .unwrap();
    // Past the lease, within retention: still replayed.
    clock.advance(Duration::from_millis(100));
    assert!(matches!(
        store.claim(&claim).await.unwrap(),
        Claim::Existing(_)
    ));
    // Past retention: gone from lookups, and a new request may use the key afresh.
    clock.advance(Duration::from_millis(2000));
    assert!(store.get(&scope).await.unwrap().is_none());
    acquired(store.claim(&claim).await.unwrap());
}

async fn prune_deletes_only_expired_rows_in_bounded_batches<S: Backend>(store: S, _db: Db) {
    let (store, clock) = on_a_manual_clock(store);
    let fp = fp("a");
    let mut keep = Vec::new();
    for i in 0..30 {
        let scope = scope(&format!("k{i}"));
        let retention = if i < 25 {
            Duration::from_millis(1)
        } else {
            Duration::from_secs(3600)
        };
        let claim = ClaimRequest {
            scope: &scope,
            fingerprint: &fp,
            lease: Duration::from_millis(1),
            retention,
        };
        let token = acquired(store.claim(&claim).await.unwrap());
        store
            .complete(&scope, token, &response("ok"))
            .await
            .unwrap();
        if i >= 25 {
            keep.push(scope);
        }
    }
    // An in-progress row with a running lease is never pruned, even past its retention.
    let live = scope("live");
    let claim = ClaimRequest {
        scope: &live,
        fingerprint: &fp,
        lease: Duration::from_secs(60),
        retention: Duration::from_millis(1),
    };
    acquired(store.claim(&claim).await.unwrap());
    clock.advance(Duration::from_millis(20));
    assert_eq!(store.prune(10).await.unwrap(), 10);
    assert_eq!(store.prune(10).await.unwrap(), 10);
    assert_eq!(prune_all(&store, 10).await.unwrap(), 5);
    assert_eq!(store.prune(10).await.unwrap(), 0);
    for scope in &keep {
        assert!(store.get(scope).await.unwrap().is_some());
    }
    // Retention over but lease running: invisible to lookups, yet still held.
    assert!(matches!(
        store
            .claim(&ClaimRequest {
                lease: Duration::from_secs(60),
                ..claim.clone()
            })
            .await
            .unwrap(),
        Claim::Acquired { .. }
    ));
}

async fn a_tombstone_is_kept_and_returned<S: Backend>(store: S, _db: Db) {
    let scope = scope(&new_key());
    let fp = fp("a");
    let token = acquired(store.claim(&req(&scope, &fp, 10_000)).await.unwrap());
    let tombstone = Completion::Tombstone {
        reason: "too large".into(),
    };
    assert!(store.complete(&scope, token, &tombstone).await.unwrap());
    match store.claim(&req(&scope, &fp, 10_000)).await.unwrap() {
        Claim::Existing(record) => {
            assert_eq!(
                record.state,
                RecordState::Tombstoned {
                    reason: "too large".into()
                }
            )
        }
        other => panic!("{}", other_kind(&other)),
    }
}

async fn keys_of_different_tenants_and_routes_are_independent<S: Backend>(store: S, _db: Db) {
    let key = IdempotencyKey::parse(new_key()).unwrap();
    let fp = fp("a");
    let a = Scope::new(
        TenantId::parse("a").unwrap(),
        "POST",
        "/payments",
        key.clone(),
    );
    let b = Scope::new(
        TenantId::parse("b").unwrap(),
        "POST",
        "/payments",
        key.clone(),
    );
    let other_route = Scope::new(
        TenantId::parse("a").unwrap(),
        "POST",
        "/refunds",
        key.clone(),
    );
    let other_method = Scope::new(TenantId::parse("a").unwrap(), "PUT", "/payments", key);
    for scope in [&a, &b, &other_route, &other_method] {
        let token = acquired(store.claim(&req(scope, &fp, 10_000)).await.unwrap());
        store
            .complete(scope, token, &response(&scope.route))
            .await
            .unwrap();
    }
}

async fn a_transactional_claim_commits_with_the_business_change<S: Backend>(store: S, _db: Db) {
    let scope = scope(&new_key());
    let fp = fp("a");
    let Claim::Acquired { token, mut tx } = store
        .claim_in_transaction(&req(&scope, &fp, 10_000), Duration::from_secs(1))
        .await
        .unwrap()
    else {
        panic!("not acquired")
    };
    // Not visible outside the transaction until it commits.
    S::insert_effect(&mut tx, "pay").await;
    assert!(
        store
            .complete_in_transaction(&mut tx, &scope, token, &response("ok"))
            .await
            .unwrap()
    );
    assert_eq!(store.count_effects().await, 0);
    tx.commit().await.unwrap();
    assert_eq!(store.count_effects().await, 1);
    assert!(matches!(
        store.get(&scope).await.unwrap().unwrap().state,
        RecordState::Completed(_)
    ));
}

async fn a_rolled_back_transactional_claim_leaves_the_key_free<S: Backend>(store: S, _db: Db) {
    let scope = scope(&new_key());
    let fp = fp("a");
    let Claim::Acquired { mut tx, .. } = store
        .claim_in_transaction(&req(&scope, &fp, 10_000), Duration::from_secs(1))
        .await
        .unwrap()
    else {
        panic!("not acquired")
    };
    S::insert_effect(&mut tx, "pay").await;
    tx.rollback().await.unwrap();
    assert_eq!(store.count_effects().await, 0);
    assert!(store.get(&scope).await.unwrap().is_none());
    acquired(store.claim(&req(&scope, &fp, 10_000)).await.unwrap());
}

async fn a_transactional_claim_waits_for_a_concurrent_owner_and_sees_its_result<S: Backend>(
    store: S,
    _db: Db,
) {
    let key = new_key();
    let scope_ = scope(&key);
    let fp_ = fp("a");
    let Claim::Acquired { token, mut tx } = store
        .claim_in_transaction(&req(&scope_, &fp_, 10_000), Duration::from_secs(1))
        .await
        .unwrap()
    else {
        panic!("not acquired")
    };
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            let (scope, fp) = (scope(&key), fp("a"));
            match store
                .claim_in_transaction(&req(&scope, &fp, 10_000), Duration::from_secs(5))
                .await
                .unwrap()
            {
                Claim::Existing(record) => record.state,
                other => panic!("waiter: {}", other_kind(&other)),
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    S::insert_effect(&mut tx, "pay").await;
    store
        .complete_in_transaction(&mut tx, &scope_, token, &response("ok"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(matches!(waiter.await.unwrap(), RecordState::Completed(r) if r.body == "ok"));
}

mod postgres_only {
    //! PostgreSQL bounds a transactional owner with its own timeouts; SQLite has one writer and
    //! is bounded by the layer's handler deadline instead (tested in `layer_contract`).

    use super::*;
    use crate::support::postgres;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_transactional_claim_gives_up_after_its_bounded_wait() {
        let (store, _db) = postgres().await;
        let scope = scope(&new_key());
        let fp = fp("a");
        let Claim::Acquired { tx: _held, .. } = store
            .claim_in_transaction(&req(&scope, &fp, 10_000), Duration::from_secs(1))
            .await
            .unwrap()
        else {
            panic!("not acquired")
        };
        let started = std::time::Instant::now();
        let second = store
            .claim_in_transaction(&req(&scope, &fp, 10_000), Duration::from_millis(100))
            .await
            .unwrap();
        assert!(matches!(second, Claim::Busy), "got {}", other_kind(&second));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_hung_transactional_owner_loses_the_key_after_its_lease_and_cannot_commit() {
        let (store, _db) = postgres().await;
        let scope = scope(&new_key());
        let fp = fp("a");
        let Claim::Acquired { token, mut tx } = store
            .claim_in_transaction(&req(&scope, &fp, 200), Duration::from_secs(1))
            .await
            .unwrap()
        else {
            panic!("not acquired")
        };
        PgKeyStoreExt::effect(&mut tx).await;
        // Idle in its transaction past the lease: the server ends that session.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Claim::Acquired {
            token: new,
            tx: mut tx2,
        } = store
            .claim_in_transaction(&req(&scope, &fp, 10_000), Duration::from_secs(1))
            .await
            .unwrap()
        else {
            panic!("the key was not taken over")
        };
        assert_ne!(token, new);
        let old_completed = store
            .complete_in_transaction(&mut tx, &scope, token, &response("old"))
            .await;
        assert!(old_completed.is_err() || tx.commit().await.is_err());
        store
            .complete_in_transaction(&mut tx2, &scope, new, &response("new"))
            .await
            .unwrap();
        tx2.commit().await.unwrap();
        assert_eq!(
            store.count_effects().await,
            0,
            "the hung owner's effect must not commit"
        );
    }

    struct PgKeyStoreExt;
    impl PgKeyStoreExt {
        async fn effect(tx: &mut sqlx::Transaction<'static, sqlx::Postgres>) {
            <oncely::store::postgres::PgKeyStore as Backend>::insert_effect(tx, "hung").await;
        }
    }
}
