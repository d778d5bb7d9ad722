//! How oncely's stores use a database pool ([`Db`]), so that the same code runs on a server of
//! its own, behind a connection pooler in transaction mode, and across a failover.
//!
//! **Transaction pooling** (PgBouncer's `pool_mode = transaction`, and the hosted poolers that
//! behave like it) hands a client's statements to whichever server connection is free, and
//! takes it back at the end of each transaction — for a statement outside a transaction, at its
//! end. Two things sqlx does then break: it prepares a statement in one round trip and runs it in
//! the next (the second may land on another server connection), and it names its prepared
//! statements per client connection (`sqlx_s_1`, …), which collide on a server connection
//! shared by many clients. So in [`Pooling::Transaction`] every statement runs inside a
//! transaction (one server connection from its `BEGIN` to its `COMMIT`), each transaction first
//! drops the prepared statements of the server connection it got (`DEALLOCATE ALL`: nothing
//! prepared by whoever used it before can collide with ours), the connections cache no statement
//! (`statement_cache_capacity(0)`, [`postgres`]), and what a session would set once (a lock
//! timeout) is set in every transaction (`SET LOCAL`): a pooler can drop none of it silently.
//! What needs one server session for longer (LISTEN, advisory locks, migrations) does not go
//! through such a pool at all.
//!
//! **Following a primary** ([`postgres`]): a read-only answer (SQLSTATE 25006) means the server
//! this process writes to is no longer the primary; every connection made before it is then
//! discarded as it comes back to the pool ([`notice`]), and the pool looks for the primary again.

pub mod open;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod schema;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Database, Either, Execute, Executor, Pool, Transaction};

/// What stands between the process and the database server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// Each pool connection is one server session (the server itself, a TCP proxy, or a pooler
    /// in session mode): statements are prepared once per connection and kept.
    #[default]
    Direct,
    /// A pooler in transaction mode: a server connection is ours only inside a transaction.
    Transaction,
}

/// Settings (`name`, `value`) a session or a transaction runs with, e.g. `lock_timeout`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings(Vec<(&'static str, String)>);

impl Settings {
    /// No settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `name = value` (a later value of the same name wins).
    pub fn set(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.0.retain(|(n, _)| *n != name);
        self.0.push((name, value.into()));
        self
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `SET` statements (`SET LOCAL` if `local`), each followed by `; `.
    pub fn statements(&self, local: bool) -> String {
        let set = if local { "SET LOCAL" } else { "SET" };
        self.0
            .iter()
            .map(|(name, value)| format!("{set} {name} = '{}'; ", value.replace('\'', "''")))
            .collect()
    }
}

/// A pool as oncely's stores use it: transactions ([`begin_with`](Self::begin_with)), single
/// statements (`&Db` is an [`Executor`]), and connections for a few statements in a row
/// ([`connection`](Self::connection)) — each of them right for the [`Pooling`] in between.
#[derive(Debug)]
pub struct Db<DB: Database> {
    pool: Pool<DB>,
    pooling: Pooling,
    /// What every transaction runs after its `BEGIN` (empty: nothing).
    after_begin: Arc<str>,
    /// Whether single statements need a transaction of their own.
    wrap: bool,
    /// The session settings (see [`Db::new`]).
    session: Settings,
}

impl<DB: Database> Clone for Db<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            pooling: self.pooling,
            after_begin: self.after_begin.clone(),
            wrap: self.wrap,
            session: self.session.clone(),
        }
    }
}

impl<DB: Database> Db<DB> {
    /// The pool, its connections being server sessions that already run with `session` (a
    /// pool's connect hook set them), or, with [`Pooling::Transaction`], bare: then every
    /// transaction sets `session` itself.
    pub fn new(pool: Pool<DB>, pooling: Pooling, session: Settings) -> Self {
        Self::made(pool, pooling, session, Settings::new())
    }

    /// The pool used directly, with whatever settings its connections have.
    pub fn direct(pool: Pool<DB>) -> Self {
        Self::new(pool, Pooling::Direct, Settings::new())
    }

    fn made(pool: Pool<DB>, pooling: Pooling, session: Settings, local: Settings) -> Self {
        let mut after_begin = String::new();
        if pooling == Pooling::Transaction {
            after_begin.push_str("DEALLOCATE ALL; ");
            after_begin.push_str(&session.statements(true));
        }
        after_begin.push_str(&local.statements(true));
        let wrap = pooling == Pooling::Transaction || !local.is_empty();
        Self {
            pool,
            pooling,
            after_begin: after_begin.into(),
            wrap,
            session,
        }
    }

    /// This pool, its transactions and single statements also running with `local` (over the
    /// session's): e.g. a worker that must wait for locks as long as it takes where requests
    /// give up. A single statement then runs in a transaction of its own.
    pub fn with_local(&self, local: Settings) -> Self {
        Self::made(self.pool.clone(), self.pooling, self.session.clone(), local)
    }

    /// The pool itself (what a migration or a listener needs; not for statements).
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// What is in between.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// A transaction begun with `begin` (`BEGIN`, `BEGIN IMMEDIATE`, or `BEGIN; SET LOCAL …`),
    /// then what this pool's transactions run first.
    pub async fn begin_with(&self, begin: &str) -> Result<Transaction<'static, DB>, sqlx::Error> {
        noticed(
            self.pool
                .begin_with(AssertSqlSafe(self.begin_statement(begin)))
                .await,
        )
    }

    /// `begin` with what this pool's transactions run first put right after its `BEGIN`, so
    /// that `begin`'s own `SET LOCAL`s come after (and win over) the session's.
    fn begin_statement(&self, begin: &str) -> String {
        if self.after_begin.is_empty() {
            return begin.to_owned();
        }
        let (head, rest) = begin.split_once(';').unwrap_or((begin, ""));
        let first = self.after_begin.trim_end_matches("; ");
        match rest.trim() {
            "" => format!("{head}; {first}"),
            rest => format!("{head}; {first}; {rest}"),
        }
    }

    /// [`begin_with`](Self::begin_with) `BEGIN`.
    pub async fn begin(&self) -> Result<Transaction<'static, DB>, sqlx::Error> {
        self.begin_with("BEGIN").await
    }

    /// A connection for a few statements in a row, each as if it ran alone: a pool connection,
    /// or (transaction pooling, own settings) a transaction. [`Conn::done`] ends it; dropped
    /// without, what a transaction did is rolled back.
    pub async fn connection(&self) -> Result<Conn<DB>, sqlx::Error> {
        Ok(if self.wrap {
            Conn::Transaction(self.begin().await?)
        } else {
            Conn::Pooled(noticed(self.pool.acquire().await)?)
        })
    }
}

/// A connection from [`Db::connection`].
#[derive(Debug)]
pub enum Conn<DB: Database> {
    /// A pool connection: each statement commits on its own.
    Pooled(PoolConnection<DB>),
    /// A transaction that [`Conn::done`] commits.
    Transaction(Transaction<'static, DB>),
}

impl<DB: Database> Conn<DB> {
    /// Commits what a transaction did; gives a pool connection back.
    pub async fn done(self) -> Result<(), sqlx::Error> {
        match self {
            Conn::Pooled(_) => Ok(()),
            Conn::Transaction(tx) => noticed(tx.commit().await),
        }
    }
}

impl<DB: Database> std::ops::Deref for Conn<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::Transaction(tx) => tx,
        }
    }
}

impl<DB: Database> std::ops::DerefMut for Conn<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::Transaction(tx) => tx,
        }
    }
}

type Step<DB> = Either<<DB as Database>::QueryResult, <DB as Database>::Row>;

/// Single statements: on the pool, or each in a transaction of its own (transaction pooling;
/// settings of this handle's own). Their rows are read whole before the commit.
impl<'c, DB> Executor<'c> for &'c Db<DB>
where
    DB: Database,
    for<'a> &'a mut DB::Connection: Executor<'a, Database = DB>,
    for<'a> &'a Pool<DB>: Executor<'a, Database = DB>,
{
    type Database = DB;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Step<DB>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, DB>,
    {
        if !self.wrap {
            return self.pool.fetch_many(query).inspect_err(notice).boxed();
        }
        futures::stream::once(async move {
            let mut tx = self.begin().await?;
            let steps: Vec<Step<DB>> = noticed(tx.as_mut().fetch_many(query).try_collect().await)?;
            noticed(tx.commit().await)?;
            Ok::<_, sqlx::Error>(futures::stream::iter(steps.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<DB::Row>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, DB>,
    {
        if !self.wrap {
            return self.pool.fetch_optional(query).map(noticed).boxed();
        }
        async move {
            let mut tx = self.begin().await?;
            let row = noticed(tx.as_mut().fetch_optional(query).await)?;
            noticed(tx.commit().await)?;
            Ok(row)
        }
        .boxed()
    }

    fn prepare_with<'e>(
        self,
        sql: sqlx::SqlStr,
        parameters: &'e [DB::TypeInfo],
    ) -> BoxFuture<'e, Result<DB::Statement, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e>(
        self,
        sql: sqlx::SqlStr,
    ) -> BoxFuture<'e, Result<sqlx::Describe<DB>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.describe(sql)
    }
}

/// The instant before which every connection is suspect (in nanoseconds after [`epoch`]; 0:
/// none), moved by a read-only answer.
static STALE_BEFORE: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// What an error says about the server this process writes to. A read-only answer (SQLSTATE
/// 25006: the server is a standby now, or a proxy routed to one) makes every connection made
/// before it suspect: each is discarded as it next comes back to or out of the pool
/// ([`made_before_stale`]). A read-only answer or a lost server (SQLSTATE classes 08, 57P; an
/// I/O error; no connection in time) wakes whatever follows the primary
/// ([`postgres::Follow`]). Every store calls this for every error it meets.
pub fn notice(error: &sqlx::Error) {
    match error {
        sqlx::Error::Database(e) if e.code().as_deref() == Some(READ_ONLY) => {
            mark_stale();
            lost();
        }
        sqlx::Error::Database(e)
            if e.code()
                .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")) =>
        {
            lost();
        }
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_) => lost(),
        // duplicate_prepared_statement, invalid_sql_statement_name: prepared statements that
        // vanish or collide never happen on a server session of our own — a pooler in
        // transaction mode stands in between, unannounced. Said once.
        sqlx::Error::Database(e) if matches!(e.code().as_deref(), Some("42P05" | "26000")) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::error!(
                    error = %e,
                    "prepared statements collide or vanish: a pooler in transaction mode stands \
                     between this process and PostgreSQL; say so (ONCELY_DATABASE_POOLER=\
                     transaction, or Pooling::Transaction for the libraries)"
                );
            });
        }
        _ => {}
    }
}

/// Makes every connection made until now suspect (see [`notice`]).
pub fn mark_stale() {
    let now = u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX);
    STALE_BEFORE.fetch_max(now.max(1), Ordering::Relaxed);
}

/// SQLSTATE read_only_sql_transaction.
pub const READ_ONLY: &str = "25006";

/// [`notice`] for a result's error.
pub fn noticed<T>(result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
    if let Err(error) = &result {
        notice(error);
    }
    result
}

/// Whether a connection `age` old was made before the last read-only answer.
pub fn made_before_stale(age: Duration) -> bool {
    let stale = STALE_BEFORE.load(Ordering::Relaxed);
    if stale == 0 {
        return false;
    }
    let now = epoch().elapsed();
    let made = now.saturating_sub(age);
    u64::try_from(made.as_nanos()).unwrap_or(u64::MAX) < stale
}

/// Counts the times a server was lost, for whatever follows the primary.
fn lost() {
    losses().send_modify(|n| *n = n.wrapping_add(1));
}

/// The count of losses [`notice`] saw; a follower waits for it to change.
pub fn losses() -> &'static tokio::sync::watch::Sender<u64> {
    static LOSSES: OnceLock<tokio::sync::watch::Sender<u64>> = OnceLock::new();
    LOSSES.get_or_init(|| tokio::sync::watch::Sender::new(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_begin_s_own_settings_come_after_the_pool_s() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect_lazy("sqlite::memory:")
            .unwrap();
        let session = Settings::new().set("lock_timeout", "1500ms");
        let db = Db::new(pool, Pooling::Transaction, session);
        assert_eq!(
            db.begin_statement("BEGIN; SET LOCAL lock_timeout = 7"),
            "BEGIN; DEALLOCATE ALL; SET LOCAL lock_timeout = '1500ms'; SET LOCAL lock_timeout = 7"
        );
        assert_eq!(
            db.begin_statement("BEGIN IMMEDIATE"),
            "BEGIN IMMEDIATE; DEALLOCATE ALL; SET LOCAL lock_timeout = '1500ms'"
        );
        let worker = db.with_local(Settings::new().set("lock_timeout", "0"));
        assert_eq!(
            worker.begin_statement("BEGIN"),
            "BEGIN; DEALLOCATE ALL; SET LOCAL lock_timeout = '1500ms'; SET LOCAL lock_timeout = '0'"
        );
        let direct = Db::direct(db.pool().clone());
        assert_eq!(
            direct.begin_statement("BEGIN; SET LOCAL x = 1"),
            "BEGIN; SET LOCAL x = 1"
        );
    }

    #[test]
    fn settings_render_quoted_and_last_wins() {
        let s = Settings::new()
            .set("lock_timeout", "1500ms")
            .set("application_name", "o'brien")
            .set("lock_timeout", "0");
        assert_eq!(
            s.statements(true),
            "SET LOCAL application_name = 'o''brien'; SET LOCAL lock_timeout = '0'; "
        );
        assert_eq!(
            s.statements(false),
            "SET application_name = 'o''brien'; SET lock_timeout = '0'; "
        );
    }

    #[test]
    fn a_read_only_answer_makes_older_connections_stale() {
        let before = STALE_BEFORE.load(Ordering::Relaxed);
        notice(&sqlx::Error::Protocol("x".into()));
        notice(&sqlx::Error::PoolTimedOut);
        assert_eq!(
            STALE_BEFORE.load(Ordering::Relaxed),
            before,
            "not read-only answers"
        );
        std::thread::sleep(Duration::from_millis(2));
        mark_stale();
        // Older than the process: made before. Made a millisecond ago: after.
        assert!(made_before_stale(
            epoch().elapsed() + Duration::from_secs(1)
        ));
        std::thread::sleep(Duration::from_millis(5));
        assert!(!made_before_stale(Duration::from_millis(1)));
    }
}
