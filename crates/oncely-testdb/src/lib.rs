//! A fresh database for every test, dropped when the test ends (pass or fail).
//!
//! PostgreSQL: [`TestPostgres::new`] creates `oncely_test_<random>` on the server named by
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`; `scripts/test` sets it)
//! and drops it on `Drop`. SQLite: [`TestSqlite::new`] makes a file in a temporary folder.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteJournalMode, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection, PgPool, SqlitePool};

/// The PostgreSQL server tests use.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| u.starts_with("postgres"))
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A throwaway PostgreSQL database.
pub struct TestPostgres {
    name: String,
    admin: PgConnectOptions,
    url: String,
}

impl TestPostgres {
    /// Creates an empty database.
    pub async fn new() -> Self {
        let server = server_url();
        let admin = PgConnectOptions::from_str(&server)
            .unwrap_or_else(|e| panic!("DATABASE_URL {server:?} is not a PostgreSQL URL: {e}"));
        let name = format!("oncely_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = admin.connect().await.unwrap_or_else(|e| {
            panic!("cannot reach PostgreSQL at {server:?} ({e}); run the tests with scripts/test")
        });
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("CREATE DATABASE");
        let _ = conn.close().await;
        let url = admin.clone().database(&name).to_url_lossy().to_string();
        Self { name, admin, url }
    }

    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new pool on the database (call it twice for two "app instances").
    pub async fn pool(&self, max_connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&self.url)
            .await
            .expect("connect to the test database")
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = self.name.clone();
        // Drop runs inside a test's runtime; use a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let mut conn = PgConnection::connect_with(&admin).await.ok()?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut conn)
                .await
                .ok()
            })
        })
        .join();
    }
}

/// A throwaway SQLite database file.
pub struct TestSqlite {
    _dir: tempfile::TempDir,
    url: String,
}

impl TestSqlite {
    /// Creates the folder; the file appears on first connection.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary folder");
        let url = format!("sqlite://{}", dir.path().join("test.db").display());
        Self { _dir: dir, url }
    }

    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new pool on the file: WAL, a busy timeout.
    pub async fn pool(&self, max_connections: u32) -> SqlitePool {
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(&self.url)
            .expect("sqlite url")
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        SqlitePoolOptions::new()
            .max_connections(max_connections)
            .connect_with(options)
            .await
            .expect("open the test database")
    }
}

impl Default for TestSqlite {
    fn default() -> Self {
        Self::new()
    }
}

/// A test's database, whichever backend: kept alive as long as the test holds it.
pub enum TestDb {
    /// PostgreSQL.
    Postgres(Box<TestPostgres>),
    /// SQLite.
    Sqlite(TestSqlite),
}

impl TestDb {
    /// The PostgreSQL database; panics on SQLite (for PostgreSQL-only helpers).
    pub fn postgres(&self) -> &TestPostgres {
        match self {
            Self::Postgres(db) => db,
            Self::Sqlite(_) => panic!("not a PostgreSQL test database"),
        }
    }
}

/// Runs generic async test bodies against both backends: `both_stores!(pg_setup, sqlite_setup;
/// case_a, case_b)` makes `case_a::postgres`, `case_a::sqlite`, … Each setup is an async fn
/// returning `(store, TestDb)`; each case is `async fn case<S>(store: S, db: TestDb)`.
#[macro_export]
macro_rules! both_stores {
    ($pg:path, $sqlite:path; $($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let (store, db) = $pg().await;
                super::$name(store, db).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                let (store, db) = $sqlite().await;
                super::$name(store, db).await;
            }
        }
    )*};
}

/// An HTTP client for tests (reqwest with rustls: installs the ring provider first).
pub fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}
