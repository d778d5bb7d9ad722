//! Migrated templates: built once however many tests ask at once, never connectable, cloned for
//! each test; built again when one is dropped (the sweep of a concurrent `scripts/test`).

#![allow(missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use oncely_testdb::{Migrations, TestPostgres, server_url};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// A set of its own for this test run (a fingerprint no other test uses): a template to build.
fn fresh_set() -> Migrations {
    Migrations::new("testdb").setup(&uuid::Uuid::new_v4().to_string())
}

/// A database migrated by creating `migrated`, counting the builds in `built`; the migration
/// leaves a connection open (the build ends it).
async fn migrated(migrations: &Migrations, built: &Arc<AtomicUsize>) -> TestPostgres {
    let built = Arc::clone(built);
    TestPostgres::migrated(migrations, async move |url: String| {
        built.fetch_add(1, Ordering::SeqCst);
        let mut conn = PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql("CREATE TABLE migrated (id int)")
            .execute(&mut conn)
            .await
            .unwrap();
        std::mem::forget(conn);
    })
    .await
}

async fn admin() -> PgConnection {
    PgConnection::connect(&server_url()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tests_that_ask_at_once_share_one_build_and_each_get_a_clone() {
    let migrations = fresh_set();
    let built = Arc::new(AtomicUsize::new(0));
    let mut asking = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (migrations, built) = (migrations.clone(), Arc::clone(&built));
        asking.spawn(async move { migrated(&migrations, &built).await });
    }
    let databases = asking.join_all().await;
    assert_eq!(built.load(Ordering::SeqCst), 1, "built once");
    let mut names: Vec<&str> = databases.iter().map(TestPostgres::name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), 8, "a database each");
    for db in &databases {
        assert!(db.name().starts_with("oncely_test_"), "{}", db.name());
        let mut conn = PgConnection::connect(db.url()).await.unwrap();
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM migrated")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(rows, 0, "{} is migrated", db.name());
    }
    let template = migrations.template();
    let mut admin = admin().await;
    let (is_template, connectable): (bool, bool) =
        sqlx::query_as("SELECT datistemplate, datallowconn FROM pg_database WHERE datname = $1")
            .bind(&template)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert!(is_template && !connectable, "{template}");
    let building: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_database WHERE datname LIKE 'oncely\\_tbuild\\_testdb\\_' || $1",
    )
    .bind(migrations.fingerprint())
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(building, 0, "nothing left half built");
}

#[tokio::test]
async fn a_template_dropped_by_a_sweep_is_built_again() {
    let migrations = fresh_set();
    let built = Arc::new(AtomicUsize::new(0));
    let _first = migrated(&migrations, &built).await;
    let template = migrations.template();
    let mut admin = admin().await;
    // What the sweep of scripts/test does.
    for sql in [
        format!("ALTER DATABASE {template} WITH IS_TEMPLATE false"),
        format!("DROP DATABASE {template}"),
    ] {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let second = migrated(&migrations, &built).await;
    assert_eq!(built.load(Ordering::SeqCst), 2, "built again");
    let mut conn = PgConnection::connect(second.url()).await.unwrap();
    sqlx::query("SELECT count(*) FROM migrated")
        .execute(&mut conn)
        .await
        .expect("migrated");
}

#[tokio::test]
async fn an_empty_database_has_no_tables() {
    let db = TestPostgres::empty().await;
    let mut conn = PgConnection::connect(db.url()).await.unwrap();
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(tables, 0);
}
