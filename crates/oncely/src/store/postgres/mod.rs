//! The PostgreSQL key store: [`PgKeyStore`].
//!
//! Its statements are in `sql.rs`; the Rust it shares with SQLite in `store::sql`. Here are the
//! steps that differ: a claim runs on an autocommit connection (its statement inserts or reads
//! in one round trip), a transactional claim bounds its waits with PostgreSQL's own timeouts,
//! and a lock timeout means a concurrent owner of *this key* ([`Claim::Busy`]).

mod sql;

use std::time::Duration;

use oncely_sql::Db;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgQueryResult;
use sqlx::{FromRow, PgConnection, Postgres, Transaction};
use time::OffsetDateTime;

use super::sql::{
    ClaimArgs, Dialect, InsertOrRead, KeyRow, Queries, Statements, millis, statements,
};
use super::{Claim, ClaimRequest, Clock, SqlKeyStore, StoreError};
use crate::Scope;

/// A [`KeyStore`](super::KeyStore) on PostgreSQL. Times come from the database's clock
/// (`now()`) unless [`with_clock`](SqlKeyStore::with_clock) injects one.
pub type PgKeyStore = SqlKeyStore<Postgres>;

pub use super::sql::MIGRATIONS_TABLE;

/// Pool options for the pool a [`PgKeyStore`] (or any of oncely's PostgreSQL stores) runs on:
/// no ping before every acquire (a round trip per request), only after a second idle; see
/// [`oncely_sql::postgres::pool_options`]. Set the size and timeouts on the result as usual:
///
/// ```no_run
/// # async fn run() -> Result<(), sqlx::Error> {
/// let pool = oncely::store::postgres::pool_options()
///     .max_connections(16)
///     .connect("postgres://localhost/app")
///     .await?;
/// let store = oncely::store::postgres::PgKeyStore::new(pool);
/// # Ok(()) }
/// ```
pub use oncely_sql::postgres::{IDLE_BEFORE_PING, pool_options};

/// This store's migrations, for callers that run them with their own tooling.
pub fn migrator() -> Migrator {
    super::sql::with_history_table(sqlx::migrate!("migrations/postgres"))
}

/// The claim statement's row: whether it inserted, and the key's row.
#[derive(FromRow)]
struct ClaimRow {
    inserted: bool,
    #[sqlx(flatten)]
    row: KeyRow,
}

fn is_lock_timeout(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(e) if e.code().as_deref() == Some("55P03"))
}

impl super::sql::sealed::Sealed for Postgres {}

impl Dialect for Postgres {
    const STATEMENTS: Statements = statements!(sql);

    type Now = Option<OffsetDateTime>;

    type Held = ();

    fn now(clock: &Clock) -> Self::Now {
        clock.injected().map(OffsetDateTime::from)
    }

    fn migrator() -> Migrator {
        migrator()
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn claim(store: &PgKeyStore, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let mut conn = store.db().connection().await?;
        let claim = Self::claim_on(&mut conn, req, store.clock()).await?;
        conn.done().await?;
        Ok(claim)
    }

    async fn begin_claim(
        db: &Db<Postgres>,
        req: &ClaimRequest<'_>,
        wait: Duration,
    ) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        // lock_timeout bounds the wait on a concurrent owner's uncommitted insert of the same
        // key (and later lock waits of the handler); the two session timeouts end a hung owner's
        // transaction after its lease, which frees the key for the next request.
        let begin = format!(
            "BEGIN; SET LOCAL lock_timeout = {}; SET LOCAL idle_in_transaction_session_timeout = {}; \
             SET LOCAL statement_timeout = {}",
            millis(wait).max(1),
            millis(req.lease).max(1),
            millis(req.lease).max(1),
        );
        db.begin_with(&begin).await
    }

    async fn insert_or_read(
        conn: &mut PgConnection,
        args: &ClaimArgs<'_, Self>,
    ) -> Result<InsertOrRead, StoreError> {
        let row = Self::claim_query(Self::STATEMENTS.claim, args)
            .try_map(|row| ClaimRow::from_row(&row))
            .fetch_optional(conn)
            .await?;
        Ok(match row {
            Some(ClaimRow { inserted: true, .. }) => InsertOrRead::Inserted,
            Some(ClaimRow { row, .. }) => InsertOrRead::Found(row),
            None => InsertOrRead::Raced,
        })
    }

    fn contended<T>(_: &(), _: &Scope, error: sqlx::Error) -> Result<Claim<T>, StoreError> {
        // The wait for the key's row lock ran out: a concurrent owner of this key holds it.
        if is_lock_timeout(&error) {
            Ok(Claim::Busy)
        } else {
            Err(error.into())
        }
    }

    fn hold(_: &(), _: &Scope) -> impl Send + 'static {
        // The row lock tells a waiting claim that a concurrent owner holds this key.
    }
}
