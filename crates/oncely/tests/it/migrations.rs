//! The migrators (`sqlx::migrate!`) keep what the previous release's hand-built ones applied:
//! the same versions and checksums in the same history table, so a database that release
//! migrated keeps migrating, and the store starts on it.

use std::time::Duration;

use oncely::store::postgres::{self, PgKeyStore};
use oncely::store::sqlite::{self, SqliteKeyStore};
use oncely::store::{Claim, ClaimRequest, KeyStore};
use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

use crate::support::{new_key, scope, secret};

/// The migrator of the previous release, as it was written: one migration built by hand.
fn previous_release(sql: &'static str) -> Migrator {
    let mut migrator = Migrator::with_migrations(vec![Migration::new(
        1,
        "idempotency keys".into(),
        MigrationType::Simple,
        sql.into_sql_str(),
        false,
    )]);
    migrator.dangerous_set_table_name("_oncely_idempotency_migrations");
    migrator.set_ignore_missing(true);
    migrator
}

const PREVIOUS_POSTGRES: &str = include_str!("../../migrations/postgres/0001_idempotency_keys.sql");
const PREVIOUS_SQLITE: &str = include_str!("../../migrations/sqlite/0001_idempotency_keys.sql");

/// (version, checksum) of each migration: what the history table keeps and compares.
fn recorded(migrator: &Migrator) -> Vec<(i64, Vec<u8>)> {
    migrator
        .iter()
        .map(|m| (m.version, m.checksum.to_vec()))
        .collect()
}

#[test]
fn the_migrators_keep_the_previous_releases_versions_and_checksums() {
    // Migrations only add: the previous release's come first, unchanged; later ones follow
    // (0002, the shared secret's tables).
    for (now, before) in [
        (postgres::migrator(), previous_release(PREVIOUS_POSTGRES)),
        (sqlite::migrator(), previous_release(PREVIOUS_SQLITE)),
    ] {
        let (now, before) = (recorded(&now), recorded(&before));
        assert!(now.len() > before.len(), "{now:?}");
        assert_eq!(now[..before.len()], before[..]);
        assert!(
            now.windows(2).all(|w| w[0].0 < w[1].0),
            "ascending: {now:?}"
        );
    }
}

/// The store migrates (twice, as on a restart) over the previous release's history and works.
async fn keeps_migrating_and_works<S: KeyStore>(store: S) {
    store
        .migrate()
        .await
        .expect("the new migrator accepts the previous release's history");
    store.migrate().await.expect("and again, as on a restart");
    let scope = scope(&new_key());
    let fingerprint = oncely::Fingerprint::of_request(
        &secret(),
        &oncely::fingerprint::RequestTarget::route("POST", "/payments"),
        None,
        b"{}",
        None,
    );
    let claim = ClaimRequest {
        scope: &scope,
        fingerprint: &fingerprint,
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(60),
    };
    assert!(matches!(
        store.claim(&claim).await.unwrap(),
        Claim::Acquired { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_database_migrated_by_the_previous_release_keeps_migrating() {
    let db = oncely_testdb::TestPostgres::empty().await;
    let pool = db.pool(4).await;
    previous_release(PREVIOUS_POSTGRES)
        .run(&pool)
        .await
        .unwrap();
    keeps_migrating_and_works(PgKeyStore::new(pool)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_database_migrated_by_the_previous_release_keeps_migrating() {
    let db = oncely_testdb::TestSqlite::new();
    let pool = db.pool(4).await;
    previous_release(PREVIOUS_SQLITE).run(&pool).await.unwrap();
    keeps_migrating_and_works(SqliteKeyStore::new(pool)).await;
}
