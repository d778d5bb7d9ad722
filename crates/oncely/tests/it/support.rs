//! What the tests share: a store per backend, with a business table to count effects in.

use std::future::Future;

use oncely::store::postgres::PgKeyStore;
use oncely::store::sqlite::SqliteKeyStore;
use oncely::store::{Clock, Dialect, KeyStore, SqlKeyStore};
use oncely::{IdempotencyKey, Scope, ServerSecret, TenantId};
use oncely_testdb::{Migrations, TestPostgres, TestSqlite};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

/// A key store the tests can also write business rows through, and put on another clock.
pub trait Backend: KeyStore {
    /// Writes one business row (`effects`) on `conn`.
    fn insert_effect(
        conn: &mut <Self::Database as Database>::Connection,
        label: &str,
    ) -> impl Future<Output = ()> + Send;
    /// How many business rows committed.
    fn count_effects(&self) -> impl Future<Output = i64> + Send;
    /// The same store on `clock`.
    fn with_clock(self, clock: impl Into<Clock>) -> Self;
    /// Closes its pool: every later database call of the store fails.
    fn close(&self) -> impl Future<Output = ()> + Send;
}

pub use oncely_testdb::TestDb as Db;

const EFFECTS: &str = "CREATE TABLE effects (label TEXT NOT NULL)";

pub async fn postgres() -> (PgKeyStore, Db) {
    let migrations = Migrations::new("keys")
        .migrator(&oncely::store::postgres::migrator())
        .setup(EFFECTS);
    let db = TestPostgres::migrated(&migrations, async |url: String| {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        PgKeyStore::new(pool.clone())
            .migrate()
            .await
            .expect("migrate");
        sqlx::query(EFFECTS).execute(&pool).await.unwrap();
        pool.close().await;
    })
    .await;
    let store = PgKeyStore::new(db.pool(30).await);
    // Up to date already (and checked so).
    store.migrate().await.expect("migrate");
    (store, Db::Postgres(Box::new(db)))
}

/// A second store (its own pool: another "app instance") on the same database.
pub async fn postgres_again(db: &Db) -> PgKeyStore {
    PgKeyStore::new(db.postgres().pool(30).await)
}

pub async fn sqlite() -> (SqliteKeyStore, Db) {
    let db = TestSqlite::new();
    let store = SqliteKeyStore::new(db.pool(16).await);
    store.migrate().await.expect("migrate");
    sqlx::query(EFFECTS).execute(store.pool()).await.unwrap();
    (store, Db::Sqlite(db))
}

// `$1` is a parameter in both dialects.
impl<DB> Backend for SqlKeyStore<DB>
where
    DB: Dialect,
    Self: KeyStore<Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'r> (i64,): FromRow<'r, DB::Row>,
{
    async fn insert_effect(conn: &mut DB::Connection, label: &str) {
        sqlx::query("INSERT INTO effects (label) VALUES ($1)")
            .bind(label)
            .execute(conn)
            .await
            .unwrap();
    }
    async fn count_effects(&self) -> i64 {
        let mut conn = self.pool().acquire().await.unwrap();
        sqlx::query_scalar::<DB, i64>("SELECT count(*) FROM effects")
            .fetch_one(&mut *conn)
            .await
            .unwrap()
    }
    fn with_clock(self, clock: impl Into<Clock>) -> Self {
        SqlKeyStore::with_clock(self, clock)
    }
    async fn close(&self) {
        self.pool().close().await;
    }
}

pub fn secret() -> ServerSecret {
    ServerSecret::new(b"test-secret-test-secret-test-secret".to_vec()).unwrap()
}

pub fn scope(key: &str) -> Scope {
    Scope::new(
        TenantId::default(),
        "POST",
        "/payments",
        IdempotencyKey::parse(key).unwrap(),
    )
}

pub fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `both_stores!(case, …)`: each case on PostgreSQL and SQLite.
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        oncely_testdb::both_stores!(crate::support::postgres, crate::support::sqlite; $($name),*);
    };
}
pub(crate) use both_stores;
