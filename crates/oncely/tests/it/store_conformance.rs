//! The conformance suite every `KeyStore` passes: the same cases on PostgreSQL and SQLite.

use std::time::Duration;

use bytes::Bytes;
use oncely::fingerprint::RequestTarget;
use oncely::store::{
    Claim, ClaimRequest, Completion, FencingToken, KeyStore, KeyTransaction, ManualClock,
    RecordState, StoreError, StoredResponse, prune_all,
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
    lasting(scope, fingerprint, lease_ms, 3_600_000)
}

/// A claim with a lease of `lease_ms` and a retention of `retention_ms`.
fn lasting<'a>(
    scope: &'a Scope,
    fingerprint: &'a Fingerprint,
    lease_ms: u64,
    retention_ms: u64,
) -> ClaimRequest<'a> {
    ClaimRequest {
        scope,
        fingerprint,
        lease: Duration::from_millis(lease_ms),
        retention: Duration::from_millis(retention_ms),
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

/// The store's calls as this suite makes them, unwrapped: every call is expected to reach the
/// database.
trait Calls: KeyStore {
    /// Claims `scope` for the request `fp` with a lease of `lease_ms` (retention: an hour).
    async fn claim_for(&self, scope: &Scope, fp: &Fingerprint, lease_ms: u64) -> Claim {
        self.claim(&req(scope, fp, lease_ms)).await.unwrap()
    }
    /// Completes with a 201 whose body is `body`; whether `token` still owned the key.
    async fn completes(&self, scope: &Scope, token: FencingToken, body: &str) -> bool {
        self.complete(scope, token, &response(body)).await.unwrap()
    }
    /// Renews for a minute; whether `token` still owned the key.
    async fn renews(&self, scope: &Scope, token: FencingToken) -> bool {
        self.renew(scope, token, Duration::from_secs(60))
            .await
            .unwrap()
    }
    /// Releases; whether `token` still owned the key.
    async fn releases(&self, scope: &Scope, token: FencingToken) -> bool {
        self.release(scope, token).await.unwrap()
    }
    /// Claims in a transaction, waiting at most `wait` for a concurrent owner.
    async fn claim_in_tx_for(
        &self,
        scope: &Scope,
        fp: &Fingerprint,
        lease_ms: u64,
        wait: Duration,
    ) -> Claim<KeyTransaction<Self::Database>> {
        self.claim_in_transaction(&req(scope, fp, lease_ms), wait)
            .await
            .unwrap()
    }
    /// Claims in a transaction (waiting at most a second), which must acquire the key.
    async fn acquire_in_tx(
        &self,
        scope: &Scope,
        fp: &Fingerprint,
        lease_ms: u64,
    ) -> (FencingToken, KeyTransaction<Self::Database>) {
        acquired_in_tx(
            self.claim_in_tx_for(scope, fp, lease_ms, Duration::from_secs(1))
                .await,
        )
    }
    /// Completes with a 201 whose body is `body` in the claiming transaction.
    async fn completes_in(
        &self,
        tx: &mut KeyTransaction<Self::Database>,
        scope: &Scope,
        token: FencingToken,
        body: &str,
    ) -> Result<bool, StoreError> {
        self.complete_in_transaction(tx, scope, token, &response(body))
            .await
    }
}

impl<S: KeyStore> Calls for S {}

/// The store on a clock that stands still until the test advances it: a lease or a retention
/// period passes at once, and never before the test says so.
fn on_a_manual_clock<S: Backend>(store: S) -> (S, ManualClock) {
    let clock = ManualClock::starting_now();
    (store.with_clock(clock.clone()), clock)
}

fn acquired<T>(claim: Claim<T>) -> FencingToken {
    acquired_in_tx(claim).0
}

/// The token and the transaction of a claim that acquired the key.
fn acquired_in_tx<T>(claim: Claim<T>) -> (FencingToken, T) {
    match claim {
        Claim::Acquired { token, tx } => (token, tx),
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
    acquired(store.claim_for(&scope, &fp, 10_000).await);
    match store.claim_for(&scope, &fp, 10_000).await {
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
            store.claim_for(&scope, &fp, 10_000).await
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
    let token = acquired(store.claim_for(&scope, &fp, 10_000).await);
    assert!(!store.completes(&scope, FencingToken::new(), "x").await);
    assert!(store.completes(&scope, token, "ok").await);
    // A completed key cannot be completed again, not even by its owner.
    assert!(!store.completes(&scope, token, "again").await);
}

async fn completed_keys_return_their_response_without_unlisted_headers<S: Backend>(
    store: S,
    _db: Db,
) {
    let scope = scope(&new_key());
    let fp = fp("a");
    let token = acquired(store.claim_for(&scope, &fp, 10_000).await);
    store.completes(&scope, token, r#"{"id":1}"#).await;
    let expected = RecordState::Completed(StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: Bytes::from_static(br#"{"id":1}"#),
    });
    assert_eq!(store.get(&scope).await.unwrap().unwrap().state, expected);
    match store.claim_for(&scope, &fp, 10_000).await {
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
    let old = acquired(store.claim_for(&scope, &fp, 100).await);
    clock.advance(Duration::from_millis(150));
    let new = acquired(store.claim_for(&scope, &fp, 10_000).await);
    assert_ne!(old, new);
    assert!(!store.completes(&scope, old, "old").await);
    assert!(!store.releases(&scope, old).await);
    assert!(store.completes(&scope, new, "new").await);
    let Some(record) = store.get(&scope).await.unwrap() else {
        panic!("row gone")
    };
    assert!(matches!(record.state, RecordState::Completed(r) if r.body == "new"));
}

async fn an_expired_lease_is_not_taken_over_by_a_different_request<S: Backend>(store: S, _db: Db) {
    let (store, clock) = on_a_manual_clock(store);
    let scope = scope(&new_key());
    acquired(store.claim_for(&scope, &fp("a"), 50).await);
    clock.advance(Duration::from_millis(100));
    match store.claim_for(&scope, &fp("b"), 10_000).await {
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
    let token = acquired(store.claim_for(&scope, &fp, 300).await);
    // Renewed well past the first lease: never taken over while renewals keep coming.
    assert!(store.renews(&scope, token).await);
    clock.advance(Duration::from_millis(400));
    match store.claim_for(&scope, &fp, 10_000).await {
        Claim::Existing(record) => {
            assert_eq!(record.state, RecordState::InProgress { lease_active: true });
        }
        other => panic!("a renewed claim was taken over: {}", other_kind(&other)),
    }
    // Another token cannot renew, and neither can the owner once the key is completed.
    assert!(!store.renews(&scope, FencingToken::new()).await);
    assert!(store.completes(&scope, token, "done").await);
    assert!(!store.renews(&scope, token).await);
    assert!(matches!(
        store.get(&scope).await.unwrap().unwrap().state,
        RecordState::Completed(_)
    ));
    // A lapsed, taken-over owner cannot renew its way back.
    let scope = crate::support::scope(&new_key());
    let old = acquired(store.claim_for(&scope, &fp, 50).await);
    clock.advance(Duration::from_millis(100));
    let new = acquired(store.claim_for(&scope, &fp, 10_000).await);
    assert!(!store.renews(&scope, old).await);
    assert!(store.renews(&scope, new).await);
}

async fn release_frees_the_key_only_for_its_owner<S: Backend>(store: S, _db: Db) {
    let scope = scope(&new_key());
    let fp = fp("a");
    let token = acquired(store.claim_for(&scope, &fp, 10_000).await);
    assert!(!store.releases(&scope, FencingToken::new()).await);
    assert!(store.releases(&scope, token).await);
    assert!(store.get(&scope).await.unwrap().is_none());
    acquired(store.claim_for(&scope, &fp, 10_000).await);
}

async fn lease_and_retention_are_separate<S: Backend>(store: S, _db: Db) {
    let (store, clock) = on_a_manual_clock(store);
    let scope = scope(&new_key());
    let fp = fp("a");
    let claim = lasting(&scope, &fp, 50, 2000);
    let claimed_at = clock.now();
    let token = acquired(store.claim(&claim).await.unwrap());
    store.completes(&scope, token, "ok").await;
    // A lookup says when the retention ends (to the millisecond: SQLite keeps no finer).
    let expires_at = store.get(&scope).await.unwrap().unwrap().expires_at;
    let ms =
        |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    assert_eq!(
        expires_at.map(ms),
        Some(ms(claimed_at + Duration::from_millis(2000)))
    );
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
        let retention_ms = if i < 25 { 1 } else { 3_600_000 };
        let claim = lasting(&scope, &fp, 1, retention_ms);
        let token = acquired(store.claim(&claim).await.unwrap());
        store.completes(&scope, token, "ok").await;
        if i >= 25 {
            keep.push(scope);
        }
    }
    // An in-progress row with a running lease is never pruned, even past its retention.
    let live = scope("live");
    let claim = lasting(&live, &fp, 60_000, 1);
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
    let token = acquired(store.claim_for(&scope, &fp, 10_000).await);
    let tombstone = Completion::Tombstone {
        reason: "too large".into(),
    };
    assert!(store.complete(&scope, token, &tombstone).await.unwrap());
    match store.claim_for(&scope, &fp, 10_000).await {
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
        let token = acquired(store.claim_for(scope, &fp, 10_000).await);
        store.completes(scope, token, &scope.route).await;
    }
}

async fn a_transactional_claim_commits_with_the_business_change<S: Backend>(store: S, _db: Db) {
    let scope = scope(&new_key());
    let fp = fp("a");
    let (token, mut tx) = store.acquire_in_tx(&scope, &fp, 10_000).await;
    // Not visible outside the transaction until it commits.
    S::insert_effect(&mut tx, "pay").await;
    assert!(
        store
            .completes_in(&mut tx, &scope, token, "ok")
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
    let (_, mut tx) = store.acquire_in_tx(&scope, &fp, 10_000).await;
    S::insert_effect(&mut tx, "pay").await;
    tx.rollback().await.unwrap();
    assert_eq!(store.count_effects().await, 0);
    assert!(store.get(&scope).await.unwrap().is_none());
    acquired(store.claim_for(&scope, &fp, 10_000).await);
}

async fn a_transactional_claim_waits_for_a_concurrent_owner_and_sees_its_result<S: Backend>(
    store: S,
    _db: Db,
) {
    let key = new_key();
    let scope_ = scope(&key);
    let fp_ = fp("a");
    let (token, mut tx) = store.acquire_in_tx(&scope_, &fp_, 10_000).await;
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            let (scope, fp) = (scope(&key), fp("a"));
            match store
                .claim_in_tx_for(&scope, &fp, 10_000, Duration::from_secs(5))
                .await
            {
                Claim::Existing(record) => record.state,
                other => panic!("waiter: {}", other_kind(&other)),
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    S::insert_effect(&mut tx, "pay").await;
    store
        .completes_in(&mut tx, &scope_, token, "ok")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(matches!(waiter.await.unwrap(), RecordState::Completed(r) if r.body == "ok"));
}

mod postgres_only {
    //! PostgreSQL bounds a transactional owner with its own timeouts; SQLite has one writer and
    //! is bounded by the layer's handler deadline instead (tested in `layer_contract`).

    use oncely::store::postgres::PgKeyStore;

    use super::*;
    use crate::support::postgres;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_transactional_claim_gives_up_after_its_bounded_wait() {
        let (store, _db) = postgres().await;
        let scope = scope(&new_key());
        let fp = fp("a");
        let (_, _held) = store.acquire_in_tx(&scope, &fp, 10_000).await;
        let started = std::time::Instant::now();
        let second = store
            .claim_in_tx_for(&scope, &fp, 10_000, Duration::from_millis(100))
            .await;
        assert!(matches!(second, Claim::Busy), "got {}", other_kind(&second));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_hung_transactional_owner_loses_the_key_after_its_lease_and_cannot_commit() {
        let (store, _db) = postgres().await;
        let scope = scope(&new_key());
        let fp = fp("a");
        let (token, mut tx) = store.acquire_in_tx(&scope, &fp, 200).await;
        PgKeyStore::insert_effect(&mut tx, "hung").await;
        // Idle in its transaction past the lease: the server ends that session.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Claim::Acquired {
            token: new,
            tx: mut tx2,
        } = store
            .claim_in_tx_for(&scope, &fp, 10_000, Duration::from_secs(1))
            .await
        else {
            panic!("the key was not taken over")
        };
        assert_ne!(token, new);
        let old_completed = store.completes_in(&mut tx, &scope, token, "old").await;
        assert!(old_completed.is_err() || tx.commit().await.is_err());
        store
            .completes_in(&mut tx2, &scope, new, "new")
            .await
            .unwrap();
        tx2.commit().await.unwrap();
        assert_eq!(
            store.count_effects().await,
            0,
            "the hung owner's effect must not commit"
        );
    }
}
