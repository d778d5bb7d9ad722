//! A long history costs the live statements nothing: with thousands of finished jobs and
//! attempts kept, claiming, finishing and releasing a job read its row and its attempts through
//! their indexes, never a whole table (PostgreSQL chose a scan of every attempt for a claim's
//! "close the abandoned attempts" step — 11 ms a claim with 60,000 attempts kept, and growing
//! with them — and a scan of every job for the claim's update of the rows it took).

use std::time::Duration;

use oncely_outbox::store::Finish;
use oncely_outbox::store::postgres::PgJobStore;
use oncely_outbox::{JobStore, NewJob};
use serde_json::json;
use sqlx::PgPool;

/// Sequential scans of the outbox's tables so far (jobs, attempts). The pool has one
/// connection: the statements under test ran on it, and `pg_stat_force_next_flush` makes it
/// report them to the shared statistics when this statement ends, before the read that follows.
async fn table_scans(pool: &PgPool) -> (i64, i64) {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT (SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'oncely_outbox'),
                (SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'oncely_outbox_attempts')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn claims_finishes_and_releases_never_scan_a_whole_table() {
    let db = crate::support::migrated_postgres().await;
    let pool = db.pool(1).await;
    let store = PgJobStore::new(pool.clone());
    store.migrate().await.unwrap();
    // 20,000 sent jobs, each with its attempt, and statistics about them.
    sqlx::query(
        "WITH jobs AS (
             INSERT INTO oncely_outbox (operation_key, kind, payload, delivery_key, status,
                                        attempts, sent_at)
             SELECT 'old:' || g, 'email', '{}', gen_random_uuid(), 'sent', 1, now()
               FROM generate_series(1, 20000) g
             RETURNING id)
         INSERT INTO oncely_outbox_attempts
                (job_id, attempt, worker, lease_token, started_at, finished_at, result)
         SELECT id, 1, 'old', gen_random_uuid(), now(), now(), 'sent' FROM jobs",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE").execute(&pool).await.unwrap();
    for n in 0..2 {
        let mut tx = pool.begin().await.unwrap();
        let job = NewJob::new(format!("new:{n}"), "email", json!({}));
        store.enqueue(&mut tx, &job).await.unwrap();
        tx.commit().await.unwrap();
    }
    let before = table_scans(&pool).await;
    let kinds = ["email".to_owned()];
    let lease = Duration::from_secs(30);
    // Claims of 500, as a busy worker makes them (the plan depends on the batch).
    let claimed = store.claim("w", &kinds, 500, lease).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert!(store.release(&claimed[1]).await.unwrap(), "released");
    let sent = Finish::sent(None);
    let owned = store.finish_all(&[(&claimed[0], &sent)]).await.unwrap();
    assert_eq!(owned, [true]);
    // Claimed again: its attempt was released, so nothing is closed as abandoned.
    let again = store.claim("w", &kinds, 500, lease).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        table_scans(&pool).await,
        before,
        "(jobs, attempts): a claim, a release or a finish read a whole table"
    );
}
