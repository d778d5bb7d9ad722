//! The replay cache: repeats of finished keys answered from memory, never past the row's
//! retention, never a key that is not finished, bounded by bytes.

use std::time::{Duration, SystemTime};

use http::StatusCode;
use oncely::store::ManualClock;
use oncely::{IdempotencyLayer, Outcome, ReplayCache};

use crate::layer_contract::{Effects, app, send};
use crate::support::{Backend, Db, both_stores, new_key};

both_stores!(
    repeats_of_a_finished_key_are_answered_from_memory_once_read,
    a_cached_key_with_another_request_is_422_and_runs_nothing,
    an_entry_never_outlives_its_keys_retention_on_the_stores_clock,
    an_entry_never_outlives_its_keys_retention_on_the_real_clock,
    released_keys_are_never_kept_and_a_retry_runs_again,
    the_cache_holds_at_most_its_bytes,
);

/// Both routes (generic `/payments`, transactional `/tx/payments`) with `cache`.
fn cached<S: Backend>(
    store: S,
    cache: &ReplayCache,
    retention: Duration,
) -> (axum::Router, Effects) {
    let effects = Effects::default();
    let tune = |layer: IdempotencyLayer<S>| layer.retention(retention).replay_cache(cache);
    (app(store, effects.clone(), tune), effects)
}

/// A new key on each route (generic, transactional), each sent twice: the repeat is replayed.
async fn replayed_on_both_routes(app: &axum::Router) -> [(&'static str, String); 2] {
    let keys = [("/payments", new_key()), ("/tx/payments", new_key())];
    for (path, key) in &keys {
        send(app, path, Some(key), "{}", &[]).await;
        let kept = send(app, path, Some(key), "{}", &[]).await;
        assert_eq!(kept.outcome, Some(Outcome::Replayed));
    }
    keys
}

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

async fn repeats_of_a_finished_key_are_answered_from_memory_once_read<S: Backend>(
    store: S,
    _db: Db,
) {
    let cache = ReplayCache::new(1 << 20);
    let (app, effects) = cached(store.clone(), &cache, DAY);
    let (uncached, _) = cached(store.clone(), &ReplayCache::new(0), DAY);
    for path in ["/payments", "/tx/payments"] {
        let key = new_key();
        let first = send(&app, path, Some(&key), "{}", &[]).await;
        assert_eq!(first.status, StatusCode::CREATED);
        // The first repeat reads the row, and keeps it.
        let read = send(&app, path, Some(&key), "{}", &[]).await;
        assert_eq!(read.outcome, Some(Outcome::Replayed));
        assert_eq!(read.body, first.body);
    }
    let kept = (0..2).map(|_| new_key()).collect::<Vec<_>>();
    for (path, key) in ["/payments", "/tx/payments"].iter().zip(&kept) {
        send(&app, path, Some(key), "{}", &[]).await;
        send(&app, path, Some(key), "{}", &[]).await;
    }
    assert_eq!(cache.entry_count(), 4);
    // Without the database, the kept keys still replay — from memory.
    store.close().await;
    for (path, key) in ["/payments", "/tx/payments"].iter().zip(&kept) {
        let again = send(&app, path, Some(key), "{}", &[]).await;
        assert_eq!(
            again.status,
            StatusCode::CREATED,
            "{path}: {:?}",
            again.json()
        );
        assert_eq!(again.outcome, Some(Outcome::Replayed));
        assert_eq!(again.headers["idempotent-replayed"], "true");
        // A layer without the cache needs the database for the same repeat.
        let without = send(&uncached, path, Some(key), "{}", &[]).await;
        assert_eq!(without.status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        // And a new key needs it too.
        let new = send(&app, path, Some(&new_key()), "{}", &[]).await;
        assert_eq!(new.status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
    }
    assert_eq!(effects.count(), 2, "the generic handler ran once per key");
}

async fn a_cached_key_with_another_request_is_422_and_runs_nothing<S: Backend>(store: S, _db: Db) {
    let cache = ReplayCache::new(1 << 20);
    let (app, effects) = cached(store, &cache, DAY);
    for path in ["/payments", "/tx/payments"] {
        let key = new_key();
        send(&app, path, Some(&key), r#"{"amount":1}"#, &[]).await;
        send(&app, path, Some(&key), r#"{"amount":1}"#, &[]).await;
        let other = send(&app, path, Some(&key), r#"{"amount":2}"#, &[]).await;
        other.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused");
        assert_eq!(other.outcome, Some(Outcome::Mismatch));
    }
    assert_eq!(cache.entry_count(), 2);
    assert_eq!(effects.count(), 1);
}

async fn an_entry_never_outlives_its_keys_retention_on_the_stores_clock<S: Backend>(
    store: S,
    _db: Db,
) {
    let clock = ManualClock::new(SystemTime::now());
    let store = store.with_clock(clock.clone());
    let cache = ReplayCache::new(1 << 20);
    let retention = Duration::from_secs(60);
    let (app, effects) = cached(store, &cache, retention);
    let keys = replayed_on_both_routes(&app).await;
    assert_eq!(cache.entry_count(), 2);
    clock.advance(retention - Duration::from_secs(1));
    for (path, key) in &keys {
        let still = send(&app, path, Some(key), "{}", &[]).await;
        assert_eq!(still.outcome, Some(Outcome::Replayed), "{path}");
    }
    // The row's retention has ended: the key is free, and the request runs again.
    clock.advance(Duration::from_secs(2));
    for (path, key) in &keys {
        let fresh = send(&app, path, Some(key), "{}", &[]).await;
        assert_eq!(fresh.status, StatusCode::CREATED, "{path}");
        assert_eq!(fresh.outcome, Some(Outcome::Created), "{path}");
    }
    assert_eq!(effects.count(), 2, "the generic handler ran again");
}

async fn an_entry_never_outlives_its_keys_retention_on_the_real_clock<S: Backend>(
    store: S,
    _db: Db,
) {
    let cache = ReplayCache::new(1 << 20);
    let retention = Duration::from_millis(1500);
    let (app, effects) = cached(store, &cache, retention);
    let keys = replayed_on_both_routes(&app).await;
    tokio::time::sleep(retention + Duration::from_millis(300)).await;
    for (path, key) in &keys {
        let fresh = send(&app, path, Some(key), "{}", &[]).await;
        assert_eq!(fresh.outcome, Some(Outcome::Created), "{path}");
    }
    assert_eq!(effects.count(), 2);
}

async fn released_keys_are_never_kept_and_a_retry_runs_again<S: Backend>(store: S, _db: Db) {
    let cache = ReplayCache::new(1 << 20);
    let (app, effects) = cached(store.clone(), &cache, DAY);
    let key = new_key();
    for _ in 0..3 {
        let failed = send(&app, "/fail", Some(&key), "{}", &[]).await;
        assert_eq!(failed.outcome, Some(Outcome::Released));
    }
    assert_eq!(effects.count(), 3);
    let key = new_key();
    for _ in 0..2 {
        let rolled_back = send(&app, "/tx/fail", Some(&key), "{}", &[]).await;
        assert_eq!(rolled_back.outcome, Some(Outcome::Released));
    }
    assert_eq!(store.count_effects().await, 0);
    assert_eq!(cache.entry_count(), 0);
}

async fn the_cache_holds_at_most_its_bytes<S: Backend>(store: S, _db: Db) {
    let budget = 16 * 1024;
    let cache = ReplayCache::new(budget);
    let (app, _) = cached(store, &cache, DAY);
    let keys = (0..120).map(|_| new_key()).collect::<Vec<_>>();
    for key in &keys {
        send(&app, "/payments", Some(key), "{}", &[]).await;
        let repeat = send(&app, "/payments", Some(key), "{}", &[]).await;
        assert_eq!(repeat.outcome, Some(Outcome::Replayed));
    }
    let (bytes, entries) = (cache.weighted_size(), cache.entry_count());
    assert!(bytes <= budget, "{bytes} bytes in a {budget}-byte cache");
    assert!(entries > 0 && entries < 120, "{entries} entries");
    // Whatever it let go is read again from the database, and replays alike.
    for key in &keys {
        let again = send(&app, "/payments", Some(key), "{}", &[]).await;
        assert_eq!(again.outcome, Some(Outcome::Replayed));
    }
}

/// SQLite binds whole milliseconds: a read at 0.9 ms past a millisecond must not reckon the
/// entry's expiry 0.9 ms past the row's.
#[tokio::test]
async fn on_sqlite_an_entry_ends_with_its_row_to_the_millisecond() {
    let (store, _db) = crate::support::sqlite().await;
    let start = SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_900);
    let clock = ManualClock::new(start);
    let store = store.with_clock(clock.clone());
    let cache = ReplayCache::new(1 << 20);
    let retention = Duration::from_secs(60);
    let (app, effects) = cached(store, &cache, retention);
    let key = new_key();
    send(&app, "/payments", Some(&key), "{}", &[]).await;
    let kept = send(&app, "/payments", Some(&key), "{}", &[]).await;
    assert_eq!(kept.outcome, Some(Outcome::Replayed));
    assert_eq!(cache.entry_count(), 1);
    // The row expires at the whole millisecond the claim bound, plus the retention.
    clock.advance(retention - Duration::from_micros(900));
    let fresh = send(&app, "/payments", Some(&key), "{}", &[]).await;
    assert_eq!(fresh.outcome, Some(Outcome::Created));
    assert_eq!(effects.count(), 2);
}
