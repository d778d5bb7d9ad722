//! A fresh database for every test.
//!
//! PostgreSQL, on the server named by `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`; `scripts/test` sets it):
//!
//! - [`TestPostgres::migrated`] clones the test's database from a migrated template
//!   (`CREATE DATABASE … TEMPLATE`: no migration runs, no checkpoint is forced). The template is
//!   built once per migration set and content — its name carries a fingerprint of the
//!   migrations ([`Migrations`]), so a changed migration gets a new one — by whichever test
//!   process needs it first, under an advisory lock, and published atomically; see
//!   [`TestPostgres::migrated`].
//! - [`TestPostgres::empty`] creates an empty database, for the tests of migrating itself.
//!
//! **Test databases are not dropped when the test ends.** A `DROP DATABASE` forces a checkpoint,
//! and the test waited for it (326 checkpoints, 89 s of the service's tests). They are left to
//! the sweep `scripts/test` does when it ends, pass or fail: `oncely_test_<created>_<run>_<random>`
//! names the time it was created and the run (`ONCELY_TEST_RUN`, which `scripts/test` sets), and
//! the sweep drops that run's databases, any created over two hours ago, and every template, many
//! at once. So plain `cargo test` or `cargo nextest run` leaves its databases behind (about 8 MB
//! each): `scripts/test --sweep` drops every test database and template on the server (not while
//! another suite runs against it), or the next `scripts/test` drops them once two hours old.
//!
//! SQLite: [`TestSqlite::new`] makes a file in a temporary folder, removed on `Drop`.

use std::future::Future;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::migrate::Migrator;
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

/// The prefix of every test database's name.
pub const TEST_PREFIX: &str = "oncely_test_";

/// The prefix of every published template's name.
pub const TEMPLATE_PREFIX: &str = "oncely_template_";

/// The prefix of a template while it is being built (never cloned; dropped by the next builder
/// if its builder died).
const BUILD_PREFIX: &str = "oncely_tbuild_";

/// The advisory lock of a template (by name) is `pg_advisory_lock(hashtext('oncely_testdb'),
/// hashtext(<name>))`: its builder holds it, and so does the sweep of `scripts/test` while it
/// drops the template.
const LOCK: &str = "SELECT pg_advisory_lock(hashtext('oncely_testdb'), hashtext($1))";
const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtext('oncely_testdb'), hashtext($1))";

/// A migration set and what identifies its content: the template of [`TestPostgres::migrated`]
/// is named `oncely_template_<set>_<fingerprint>`.
///
/// The fingerprint covers what is given: each migrator's history table and each migration's
/// version and checksum ([`Migrations::migrator`]), and any other set-up the migrate function
/// does ([`Migrations::setup`]). Whatever it does not cover (the code of the migrate function)
/// is covered by `scripts/test` dropping every template when a run starts.
#[derive(Debug, Clone)]
pub struct Migrations {
    set: String,
    hash: u64,
}

impl Migrations {
    /// A set (`server`, `outbox`: lowercase letters, digits and `_`, at most 20) with nothing
    /// in it yet.
    pub fn new(set: &str) -> Self {
        assert!(
            !set.is_empty()
                && set.len() <= 20
                && set
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "a migration set's name is [a-z0-9_]{{1,20}}: {set:?}"
        );
        let mut this = Self {
            set: set.to_owned(),
            hash: FNV_OFFSET,
        };
        this.add(set.as_bytes());
        this
    }

    /// Adds a migrator: its history table, and each migration's version, checksum and
    /// transaction mode.
    pub fn migrator(mut self, migrator: &Migrator) -> Self {
        self.add(b"migrator");
        self.add(migrator.table_name.as_bytes());
        for migration in migrator.iter() {
            self.add(&migration.version.to_le_bytes());
            self.add(&migration.checksum);
            self.add(&[u8::from(migration.no_tx)]);
        }
        self
    }

    /// Adds anything else the migrate function does (the SQL of a table it creates too).
    pub fn setup(mut self, text: &str) -> Self {
        self.add(b"setup");
        self.add(text.as_bytes());
        self
    }

    /// The fingerprint: 16 hexadecimal digits.
    pub fn fingerprint(&self) -> String {
        format!("{:016x}", self.hash)
    }

    /// The template's name: `oncely_template_<set>_<fingerprint>`.
    pub fn template(&self) -> String {
        format!("{TEMPLATE_PREFIX}{}_{}", self.set, self.fingerprint())
    }

    /// FNV-1a over the bytes, each part's length first (so parts cannot run into each other).
    fn add(&mut self, bytes: &[u8]) {
        let length = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        for byte in length.to_le_bytes().iter().chain(bytes) {
            self.hash ^= u64::from(*byte);
            self.hash = self.hash.wrapping_mul(FNV_PRIME);
        }
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// A test's PostgreSQL database: `oncely_test_<created>_<run>_<random>`, left for the sweep (see
/// the crate docs).
pub struct TestPostgres {
    name: String,
    url: String,
}

impl TestPostgres {
    /// An empty database (the same as [`TestPostgres::empty`]).
    pub async fn new() -> Self {
        Self::empty().await
    }

    /// An empty database: for the tests of migrating itself.
    pub async fn empty() -> Self {
        let (admin, mut conn) = admin().await;
        let name = test_database_name();
        execute(&mut conn, &format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        let _ = conn.close().await;
        Self::named(&admin, name)
    }

    /// A database cloned from the template of `migrations`, which is built first if no test
    /// built it yet: `migrate` gets the URL of an empty database and migrates it (and closes
    /// what it opened on it: connections still open after it returns are ended).
    ///
    /// Safe across processes (cargo-nextest runs each test in a process of its own): the
    /// template is built under an advisory lock, as `oncely_tbuild_…`, then made a template
    /// nobody may connect to (a connection to a template makes `CREATE DATABASE … TEMPLATE` fail)
    /// and published by renaming it. A template that disappears (the sweep of a concurrent
    /// `scripts/test`) is built again.
    pub async fn migrated<F, Fut>(migrations: &Migrations, migrate: F) -> Self
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = ()>,
    {
        let template = migrations.template();
        let (admin, mut conn) = admin().await;
        let name = test_database_name();
        let mut migrate = Some(migrate);
        let mut attempts = 0;
        loop {
            if !exists(&mut conn, &template).await {
                let Some(migrate) = migrate.take() else {
                    panic!("the template {template} vanished twice while this test cloned it");
                };
                build(&admin, &mut conn, &template, migrate).await;
            }
            let create = format!("CREATE DATABASE {name} TEMPLATE {template}");
            match execute(&mut conn, &create).await {
                Ok(()) => break,
                // Dropped (a concurrent sweep) between the check and the clone: built again.
                Err(_) if attempts < 3 && !exists(&mut conn, &template).await => attempts += 1,
                Err(e) => panic!("{create}: {e}"),
            }
        }
        let _ = conn.close().await;
        Self::named(&admin, name)
    }

    fn named(admin: &PgConnectOptions, name: String) -> Self {
        let url = admin.clone().database(&name).to_url_lossy().to_string();
        Self { name, url }
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
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

/// The server's options and a connection to its maintenance database.
async fn admin() -> (PgConnectOptions, PgConnection) {
    let server = server_url();
    let admin = PgConnectOptions::from_str(&server)
        .unwrap_or_else(|e| panic!("DATABASE_URL {server:?} is not a PostgreSQL URL: {e}"));
    let conn = admin.connect().await.unwrap_or_else(|e| {
        panic!("cannot reach PostgreSQL at {server:?} ({e}); run the tests with scripts/test")
    });
    (admin, conn)
}

/// `oncely_test_<seconds since 1970>_<run>_<random>`: the run is `ONCELY_TEST_RUN` (its letters
/// and digits, at most 12; `x` when unset).
fn test_database_name() -> String {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let run: String = std::env::var("ONCELY_TEST_RUN")
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .take(12)
        .collect();
    let run = if run.is_empty() { "x".to_owned() } else { run };
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{TEST_PREFIX}{created:010}_{run}_{}", &random[..16])
}

async fn execute(conn: &mut PgConnection, sql: &str) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(conn)
        .await
        .map(drop)
}

async fn exists(conn: &mut PgConnection, database: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(database)
        .fetch_one(conn)
        .await
        .expect("read pg_database")
}

/// Builds and publishes `template` unless another process did while this one waited for the
/// lock. A panic in `migrate` ends this connection, and with it the lock; the next builder
/// drops what it left.
async fn build<F, Fut>(
    admin: &PgConnectOptions,
    conn: &mut PgConnection,
    template: &str,
    migrate: F,
) where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let lock = |sql| sqlx::query(sql).bind(template.to_owned());
    lock(LOCK)
        .execute(&mut *conn)
        .await
        .expect("lock the template");
    if !exists(conn, template).await {
        let building = template.replacen(TEMPLATE_PREFIX, BUILD_PREFIX, 1);
        let step = async |conn: &mut PgConnection, sql: String| {
            execute(conn, &sql)
                .await
                .unwrap_or_else(|e| panic!("building the template {template}: {sql}: {e}"));
        };
        step(
            conn,
            format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"),
        )
        .await;
        step(conn, format!("CREATE DATABASE {building}")).await;
        migrate(admin.clone().database(&building).to_url_lossy().to_string()).await;
        // Nobody connects to it from now on; whoever still is (a pool migrate left open) is
        // ended, or the rename below would fail.
        step(
            conn,
            format!("ALTER DATABASE {building} WITH ALLOW_CONNECTIONS false"),
        )
        .await;
        let mut attempts = 0;
        loop {
            let left: i64 = sqlx::query_scalar(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1",
            )
            .bind(&building)
            .fetch_one(&mut *conn)
            .await
            .expect("end the connections to the template");
            if left == 0 {
                break;
            }
            attempts += 1;
            assert!(attempts < 100, "connections to {building} do not end");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        step(
            conn,
            format!("ALTER DATABASE {building} WITH IS_TEMPLATE true"),
        )
        .await;
        // Published: the name appears only now, complete.
        step(
            conn,
            format!("ALTER DATABASE {building} RENAME TO {template}"),
        )
        .await;
    }
    lock(UNLOCK)
        .execute(&mut *conn)
        .await
        .expect("unlock the template");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn migrator(sql: &'static str) -> Migrator {
        let mut migrator = Migrator::DEFAULT;
        migrator.migrations = vec![sqlx::migrate::Migration::new(
            1,
            "one".into(),
            sqlx::migrate::MigrationType::Simple,
            sqlx::SqlSafeStr::into_sql_str(sql),
            false,
        )]
        .into();
        migrator
    }

    #[test]
    fn a_fingerprint_is_stable_and_changes_with_any_migration_or_set_up() {
        let a = || Migrations::new("set").migrator(&migrator("CREATE TABLE a (x int)"));
        assert_eq!(a().fingerprint(), a().fingerprint());
        let fingerprints = [
            Migrations::new("set"),
            Migrations::new("other"),
            a(),
            Migrations::new("set").migrator(&migrator("CREATE TABLE b (x int)")),
            a().setup("CREATE TABLE business (note text)"),
        ]
        .map(|m| m.fingerprint());
        for (i, x) in fingerprints.iter().enumerate() {
            assert_eq!(x.len(), 16, "{x}");
            for y in &fingerprints[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }

    #[test]
    fn names_fit_in_postgresql_identifiers() {
        let longest = Migrations::new("abcdefghij0123456789").template();
        assert!(longest.len() <= 63, "{longest}");
        let building = longest.replacen(TEMPLATE_PREFIX, BUILD_PREFIX, 1);
        assert!(building.len() <= 63, "{building}");
        let test = test_database_name();
        assert!(test.len() <= 63 && test.starts_with(TEST_PREFIX), "{test}");
    }
}
