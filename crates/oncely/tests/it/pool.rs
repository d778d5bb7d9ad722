//! `store::postgres::pool_options`: no ping (no round trip) when a connection is handed out
//! again at once, a ping — and a fresh connection — when it sat idle and the server closed it.

use std::time::Duration;

use oncely::store::postgres::{IDLE_BEFORE_PING, pool_options};
use oncely_testdb::TestPostgres;
use sqlx::PgPool;

async fn backend_pid(pool: &PgPool) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
}

/// Ends the pool's one connection from another session, as a restart or an idle-connection
/// reaper (a proxy, `idle_session_timeout`) would.
async fn terminate(db: &TestPostgres, pid: i32) {
    let admin = db.pool(1).await;
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(ended);
    admin.close().await;
}

/// A pool of one connection built with [`pool_options`], whose connection was used once and
/// then ended by the server: the database, the pool and the ended backend's pid.
async fn one_connection_ended() -> (TestPostgres, PgPool, i32) {
    let db = TestPostgres::empty().await;
    let pool = pool_options()
        .max_connections(1)
        .connect(db.url())
        .await
        .unwrap();
    let first = backend_pid(&pool).await.unwrap();
    terminate(&db, first).await;
    (db, pool, first)
}

#[tokio::test]
async fn a_connection_closed_while_idle_is_pinged_and_replaced() {
    let (_db, pool, first) = one_connection_ended().await;
    tokio::time::sleep(IDLE_BEFORE_PING + Duration::from_millis(300)).await;
    let second = backend_pid(&pool)
        .await
        .expect("the dead idle connection is replaced");
    assert_ne!(first, second);
}

/// The point of the options: a connection handed out again within a second is not pinged (a
/// ping is a round trip per request). Its statement meets the closed connection, and the
/// pool then opens a new one.
#[tokio::test]
async fn a_connection_handed_out_again_at_once_is_not_pinged() {
    let (_db, pool, first) = one_connection_ended().await;
    assert!(
        backend_pid(&pool).await.is_err(),
        "the connection was pinged before it was handed out"
    );
    let second = backend_pid(&pool).await.unwrap();
    assert_ne!(first, second);
}
