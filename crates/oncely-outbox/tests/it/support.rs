//! Stores per backend, and a business table to enqueue next to.

use std::future::Future;
use std::time::Duration;

use oncely_outbox::store::postgres::PgJobStore;
use oncely_outbox::store::sqlite::SqliteJobStore;
use oncely_outbox::{Enqueued, JobStore, NewJob, OutboxError};
use oncely_testdb::{TestDb, TestPostgres, TestSqlite};

/// A job store the tests can also enqueue into (in a transaction of their own).
pub trait Backend: JobStore {
    /// Begins a transaction, writes a business row and enqueues `job`; commits if `commit`.
    fn enqueue_with_business_row(
        &self,
        job: NewJob,
        commit: bool,
    ) -> impl Future<Output = Result<Enqueued, OutboxError>> + Send;
    /// How many business rows committed.
    fn business_rows(&self) -> impl Future<Output = i64> + Send;
}

const BUSINESS: &str = "CREATE TABLE business (note TEXT NOT NULL)";

pub async fn postgres() -> (PgJobStore, TestDb) {
    let db = TestPostgres::new().await;
    let store = PgJobStore::new(db.pool(20).await);
    store.migrate().await.unwrap();
    sqlx::query(BUSINESS).execute(store.pool()).await.unwrap();
    (store, TestDb::Postgres(Box::new(db)))
}

pub async fn sqlite() -> (SqliteJobStore, TestDb) {
    let db = TestSqlite::new();
    let store = SqliteJobStore::new(db.pool(8).await);
    store.migrate().await.unwrap();
    sqlx::query(BUSINESS).execute(store.pool()).await.unwrap();
    (store, TestDb::Sqlite(db))
}

impl Backend for PgJobStore {
    async fn enqueue_with_business_row(
        &self,
        job: NewJob,
        commit: bool,
    ) -> Result<Enqueued, OutboxError> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("INSERT INTO business (note) VALUES ($1)")
            .bind(&job.operation_key)
            .execute(&mut *tx)
            .await?;
        let enqueued = oncely_outbox::store::postgres::enqueue(&mut tx, &job).await?;
        if commit {
            tx.commit().await?;
            self.wake();
        } else {
            tx.rollback().await?
        }
        Ok(enqueued)
    }
    async fn business_rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM business")
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

impl Backend for SqliteJobStore {
    async fn enqueue_with_business_row(
        &self,
        job: NewJob,
        commit: bool,
    ) -> Result<Enqueued, OutboxError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("INSERT INTO business (note) VALUES (?1)")
            .bind(&job.operation_key)
            .execute(&mut *tx)
            .await?;
        let enqueued = oncely_outbox::store::sqlite::enqueue(&mut tx, &job).await?;
        if commit {
            tx.commit().await?;
            self.notify();
        } else {
            tx.rollback().await?;
        }
        Ok(enqueued)
    }
    async fn business_rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM business")
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

pub fn kinds(k: &[&str]) -> Vec<String> {
    k.iter().map(|s| (*s).to_owned()).collect()
}

pub const LEASE: Duration = Duration::from_secs(30);

macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        oncely_testdb::both_stores!(crate::support::postgres, crate::support::sqlite; $($name),*);
    };
}
pub(crate) use both_stores;
