//! The gateway's own start-up: the key store's migrations alone (no outbox, no account table),
//! a production database required to be migrated, and the server secret its database's
//! processes share.

use oncely::ServerSecret;
use oncely::store::shared_secret::SharedSecretStore;
use oncely::store::{Dialect, KeyStore, SqlKeyStore};
use oncely_gateway::start::{Schemas, open};
use oncely_sql::open::{Location, Open};
use oncely_testdb::{TestPostgres, TestSqlite};
use secrecy::SecretString;

fn secret(name: &str) -> ServerSecret {
    ServerSecret::new(format!("{name}-0123456789-0123456789-abcdef").into_bytes()).unwrap()
}

/// The tables of the database `url`, sorted.
async fn tables<DB: Open + Dialect>(keys: &SqlKeyStore<DB>) -> Vec<String>
where
    for<'c> &'c oncely_sql::Db<DB>: sqlx::Executor<'c, Database = DB>,
    for<'r> (String,): sqlx::FromRow<'r, DB::Row>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    let sql = if <DB as Open>::NAME == "postgres" {
        "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1"
    } else {
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY 1"
    };
    let rows: Vec<(String,)> = sqlx::query_as(sql).fetch_all(keys.db()).await.unwrap();
    rows.into_iter().map(|(t,)| t).collect()
}

async fn a_development_gateway_migrates_the_key_store_alone<DB>(url: &str)
where
    DB: Open + Dialect,
    SqlKeyStore<DB>: KeyStore + SharedSecretStore,
    for<'c> &'c oncely_sql::Db<DB>: sqlx::Executor<'c, Database = DB>,
    for<'r> (String,): sqlx::FromRow<'r, DB::Row>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    let at = Location::url(url);
    let generated: SecretString = "generated-by-the-first-gateway-0123456789".into();
    let (keys, first) = open::<DB>(
        &at,
        4,
        Schemas::Migrate,
        (secret("unused"), Some(generated)),
    )
    .await
    .unwrap();
    assert_eq!(
        tables(&keys).await,
        [
            "_oncely_idempotency_migrations",
            "oncely_idempotency_keys",
            "oncely_shared_development_secret",
            "oncely_shared_secret_check",
        ],
        "the key store's tables, no outbox or account table"
    );
    // A second development gateway, which generated another secret, signs with the first's.
    let other: SecretString = "generated-by-the-second-gateway-0123456789".into();
    let (_, second) = open::<DB>(&at, 4, Schemas::Migrate, (secret("unused"), Some(other)))
        .await
        .unwrap();
    assert_eq!(second.mac("t", &[]), first.mac("t", &[]));
    // A production gateway with another secret is refused; with the database's, it starts.
    let refused = open::<DB>(&at, 4, Schemas::Require, (secret("another"), None))
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("ONCELY_SECRET is not the secret the other processes"),
        "{refused}"
    );
    let given = ServerSecret::new(b"generated-by-the-first-gateway-0123456789".to_vec()).unwrap();
    open::<DB>(&at, 4, Schemas::Require, (given, None))
        .await
        .expect("the database's secret");
}

async fn a_production_gateway_creates_and_migrates_nothing<DB>(url: &str, empty_file: bool)
where
    DB: Open + Dialect,
    SqlKeyStore<DB>: KeyStore + SharedSecretStore,
{
    let at = Location::url(url);
    let refused = open::<DB>(&at, 4, Schemas::Require, (secret("a"), None))
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    let expected = if empty_file {
        "there is no database file"
    } else {
        "holds no oncely tables: is DATABASE_URL right? run `oncely migrate`"
    };
    assert!(refused.contains(expected), "{refused}");
    assert_eq!(refused.lines().count(), 1, "{refused}");
}

#[tokio::test]
async fn on_postgres_a_development_gateway_migrates_the_key_store_alone() {
    let db = TestPostgres::empty().await;
    a_development_gateway_migrates_the_key_store_alone::<sqlx::Postgres>(db.url()).await;
}

#[tokio::test]
async fn on_sqlite_a_development_gateway_migrates_the_key_store_alone() {
    let db = TestSqlite::new();
    a_development_gateway_migrates_the_key_store_alone::<sqlx::Sqlite>(db.url()).await;
}

#[tokio::test]
async fn on_postgres_a_production_gateway_creates_and_migrates_nothing() {
    let db = TestPostgres::empty().await;
    a_production_gateway_creates_and_migrates_nothing::<sqlx::Postgres>(db.url(), false).await;
}

#[tokio::test]
async fn on_sqlite_a_production_gateway_creates_and_migrates_nothing() {
    let db = TestSqlite::new();
    a_production_gateway_creates_and_migrates_nothing::<sqlx::Sqlite>(db.url(), true).await;
    assert!(
        !std::path::Path::new(db.url().trim_start_matches("sqlite://")).exists(),
        "no file made"
    );
}
