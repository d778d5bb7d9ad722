//! PostgreSQL: production. Times come from the database clock (`now()`), so that many API and
//! worker processes on many machines agree on when a token expires.

use std::time::Duration;

use anyhow::Context;
use oncely::store::postgres::PgKeyStore;
use oncely_outbox::store::postgres::PgJobStore;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgPoolOptions, PgQueryResult};
use time::OffsetDateTime;

use super::{Backend, Stores, redact};
use crate::accounts::Statements;

/// The PostgreSQL backend.
#[derive(Debug, Clone)]
pub struct Postgres(Stores<PgKeyStore>);

impl Backend for Postgres {
    const NAME: &'static str = "postgres";
    type Database = sqlx::Postgres;
    // `None` binds NULL, and the statements read `COALESCE($n, now())`: the database clock.
    type Instant = Option<OffsetDateTime>;
    type Keys = PgKeyStore;
    type Jobs = PgJobStore;
    const ACCOUNT_SQL: Statements = crate::accounts::postgres::STATEMENTS;

    fn accepts(url: &str) -> bool {
        url.starts_with("postgres://") || url.starts_with("postgresql://")
    }

    fn migrators() -> [Migrator; 3] {
        super::migrators!(postgres, "./migrations/postgres")
    }

    async fn connect(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            // Start-up against an unreachable server fails in seconds, not half a minute.
            .acquire_timeout(Duration::from_secs(5))
            // A ping before every acquire is a round trip per request; ping only connections
            // that sat idle. A connection that died under load fails its request (503, retried
            // with the same key) and is discarded.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > Duration::from_secs(1) {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect(url)
            .await
            .with_context(|| format!("cannot connect to PostgreSQL at {}", redact(url)))?;
        Ok(Self(Stores::new(pool, PgKeyStore::new)))
    }

    fn stores(&self) -> &Stores<PgKeyStore> {
        &self.0
    }

    fn jobs(&self, poll_only: bool) -> PgJobStore {
        let jobs = PgJobStore::new(self.pool().clone());
        if poll_only { jobs.poll_only() } else { jobs }
    }

    fn at(at: Option<OffsetDateTime>) -> Option<OffsetDateTime> {
        at
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }

    fn unavailable(error: &dyn sqlx::error::DatabaseError) -> bool {
        // SQLSTATE classes 08 (connection exception), 53 (insufficient resources: too many
        // connections, disk full) and 57P (the server is shutting down or restarting).
        error
            .code()
            .is_some_and(|code| ["08", "53", "57P"].iter().any(|c| code.starts_with(c)))
    }
}
