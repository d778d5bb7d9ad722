//! The key store on a SQL database: the Rust that PostgreSQL and SQLite share, written once.
//!
//! Each dialect keeps its statements in `store/<dialect>/sql.rs`, under the same names, and says
//! there where and why they differ. Its module implements [`Dialect`]: the few steps that differ
//! in Rust too (how a claim's transaction begins, how the claim statement meets an existing
//! row, what "busy" means, where "now" comes from). Everything else — the parameters of each
//! statement, reading a row, the claim's decision, completing, renewing, releasing, pruning,
//! migrating — is here, once, over sqlx's generic API.

mod rows;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use oncely_sql::Db;
use sqlx::migrate::{Migrate, Migrator};
use sqlx::query::Query;
use sqlx::{Database, Encode, Executor, IntoArguments, Pool, Transaction, Type};
use uuid::Uuid;

use self::rows::CompletionColumns;
pub(super) use self::rows::KeyRow;
use super::{
    Claim, ClaimRequest, Clock, Completion, FencingToken, KeyStore, KeyTransaction, Record,
    StoreError,
};
use crate::Scope;

/// A duration as the statements take it: whole milliseconds.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The table that records which of this store's migrations ran (apart from other libraries').
pub const MIGRATIONS_TABLE: &str = "_oncely_idempotency_migrations";

/// A dialect's migrations (`sqlx::migrate!`), with this store's own history table.
pub(crate) fn with_history_table(mut migrator: Migrator) -> Migrator {
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    // Migrations only add: a process of the previous release must still start (and restart)
    // on a database a newer release already migrated, so versions it does not know are fine.
    migrator.set_ignore_missing(true);
    migrator
}

/// A [`KeyStore`] on a SQL database: [`PgKeyStore`](super::postgres::PgKeyStore) is the one on
/// PostgreSQL, [`SqliteKeyStore`](super::sqlite::SqliteKeyStore) the one on SQLite.
pub struct SqlKeyStore<DB: Dialect> {
    db: Db<DB>,
    clock: Clock,
    held: DB::Held,
}

impl<DB: Dialect> SqlKeyStore<DB> {
    /// A store on `pool`, on the real clock. Call [`KeyStore::migrate`] once before use.
    pub fn new(pool: Pool<DB>) -> Self {
        Self::on(Db::direct(pool))
    }

    /// A store on `db`: a pool as [`Db`] says how to use it (e.g. behind a transaction-mode
    /// pooler, see [`oncely_sql::Pooling`]).
    pub fn on(db: Db<DB>) -> Self {
        Self {
            db,
            clock: Clock::default(),
            held: DB::Held::default(),
        }
    }

    /// The same store on another clock: a [`ManualClock`](super::ManualClock) lets a test pass
    /// a lease or a retention period without waiting for it.
    pub fn with_clock(self, clock: impl Into<Clock>) -> Self {
        Self {
            clock: clock.into(),
            ..self
        }
    }

    /// The pool this store uses.
    pub fn pool(&self) -> &Pool<DB> {
        self.db.pool()
    }

    /// The pool as this store uses it.
    pub fn db(&self) -> &Db<DB> {
        &self.db
    }

    /// The clock this store reads the time from.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }
}

impl<DB: Dialect> Clone for SqlKeyStore<DB> {
    fn clone(&self) -> Self {
        Self {
            db: self.db.clone(),
            clock: self.clock.clone(),
            held: self.held.clone(),
        }
    }
}

impl<DB: Dialect> fmt::Debug for SqlKeyStore<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlKeyStore")
            .field("pool", self.db.pool())
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// The statements of one dialect, by name. Their parameters are the same in both dialects:
///
/// | statement | parameters |
/// |---|---|
/// | `CLAIM`, `TAKEOVER` | 1–4 scope, 5 fingerprint, 6 fence, 7 lease (ms), 8 retention (ms), 9 now |
/// | `SELECT` | 1–4 scope, 5 now |
/// | `COMPLETE` | 1–4 scope, 5 fence, 6 state, 7 status, 8 headers (JSON), 9 body, 10 reason, 11 now |
/// | `RENEW` | 1–4 scope, 5 fence, 6 lease (ms), 7 now |
/// | `RELEASE` | 1–4 scope, 5 fence |
/// | `PRUNE` | 1 now, 2 limit |
/// | `DEVELOPMENT_SECRET` | 1 candidate |
/// | `SECRET_CHECK` | none |
/// | `ADD_SECRET_CHECK` | 1 current, 2 previous, 3 retired |
/// | `REPLACE_SECRET_CHECK` | 1 current, 2 previous, 3 retired, 4 the current it replaces |
///
/// The scope is (tenant, method, route, key), bound by one helper.
#[derive(Debug)]
pub struct Statements {
    pub(in crate::store) claim: &'static str,
    pub(in crate::store) takeover: &'static str,
    pub(in crate::store) select: &'static str,
    pub(in crate::store) complete: &'static str,
    pub(in crate::store) renew: &'static str,
    pub(in crate::store) release: &'static str,
    pub(in crate::store) prune: &'static str,
    pub(in crate::store) development_secret: &'static str,
    pub(in crate::store) secret_check: &'static str,
    pub(in crate::store) add_secret_check: &'static str,
    pub(in crate::store) replace_secret_check: &'static str,
}

/// A dialect's [`Statements`], from the constants of its `sql` module (each dialect names them
/// the same).
macro_rules! statements {
    ($sql:ident) => {
        $crate::store::sql::Statements {
            claim: $sql::CLAIM,
            takeover: $sql::TAKEOVER,
            select: $sql::SELECT,
            complete: $sql::COMPLETE,
            renew: $sql::RENEW,
            release: $sql::RELEASE,
            prune: $sql::PRUNE,
            development_secret: $sql::DEVELOPMENT_SECRET,
            secret_check: $sql::SECRET_CHECK,
            add_secret_check: $sql::ADD_SECRET_CHECK,
            replace_secret_check: $sql::REPLACE_SECRET_CHECK,
        }
    };
}
pub(crate) use statements;

/// What an owner of a key writes to its row, fenced by its token.
#[derive(Clone, Copy)]
pub enum FencedWrite<'a> {
    /// Store the outcome (COMPLETE).
    Complete(&'a Completion),
    /// Extend the lease (RENEW).
    Renew(Duration),
    /// Free the key (RELEASE).
    Release,
}

/// What the claim statement found.
pub enum InsertOrRead {
    /// The key was free: this claim's row is in.
    Inserted,
    /// The key's row exists.
    Found(KeyRow),
    /// A concurrent request committed the key between the insert and the read: ask again.
    Raced,
}

/// The parameters of CLAIM and TAKEOVER.
pub struct ClaimArgs<'a, DB: Dialect> {
    req: &'a ClaimRequest<'a>,
    token: FencingToken,
    now: DB::Now,
}

impl<DB: Dialect> ClaimArgs<'_, DB> {
    /// The scope claimed.
    pub fn scope(&self) -> &Scope {
        self.req.scope
    }

    /// "Now" for this claim.
    pub fn now(&self) -> DB::Now {
        self.now
    }
}

pub(crate) mod sealed {
    /// Only this crate's dialects.
    pub trait Sealed {}
}

/// A SQL database a [`SqlKeyStore`] runs on: `sqlx::Postgres` or `sqlx::Sqlite` (sealed). Its
/// items are the steps in which the two differ; see the module `store::<dialect>`.
pub trait Dialect: Database + sealed::Sealed {
    /// The dialect's statements (`store/<dialect>/sql.rs`).
    #[doc(hidden)]
    const STATEMENTS: Statements;

    /// The value bound as "now".
    #[doc(hidden)]
    type Now: for<'q> Encode<'q, Self> + Type<Self> + Copy + Send + Sync + 'static;

    /// What this process remembers of the claims it holds in open transactions.
    #[doc(hidden)]
    type Held: Default + Clone + Send + Sync + 'static;

    /// "Now" for a statement, from the store's clock.
    #[doc(hidden)]
    fn now(clock: &Clock) -> Self::Now;

    /// The dialect's migrations, with their own history table.
    #[doc(hidden)]
    fn migrator() -> Migrator;

    /// How many rows a statement changed.
    #[doc(hidden)]
    fn rows_affected(done: &Self::QueryResult) -> u64;

    /// A claim in its own short statement (or transaction).
    #[doc(hidden)]
    fn claim(
        store: &SqlKeyStore<Self>,
        req: &ClaimRequest<'_>,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Begins the transaction of a transactional claim, bounded by `wait` and `req.lease`.
    #[doc(hidden)]
    fn begin_claim(
        db: &Db<Self>,
        req: &ClaimRequest<'_>,
        wait: Duration,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send;

    /// Runs the claim statement: the key inserted, or its existing row.
    #[doc(hidden)]
    fn insert_or_read(
        conn: &mut Self::Connection,
        args: &ClaimArgs<'_, Self>,
    ) -> impl Future<Output = Result<InsertOrRead, StoreError>> + Send;

    /// A transactional claim that failed with `error`: [`Claim::Busy`] if the wait for a
    /// concurrent owner of this key ran out, [`StoreError::Busy`] if the database as a whole is
    /// busy, else the error.
    #[doc(hidden)]
    fn contended<T>(
        held: &Self::Held,
        scope: &Scope,
        error: sqlx::Error,
    ) -> Result<Claim<T>, StoreError>;

    /// Remembers that an open transaction of this process holds `scope`, until the returned
    /// value is dropped (with the transaction).
    #[doc(hidden)]
    fn hold(held: &Self::Held, scope: &Scope) -> impl Send + 'static;
}

impl<DB: Dialect + Queries> KeyStore for SqlKeyStore<DB> {
    type Database = DB;

    async fn migrate(&self) -> Result<(), StoreError> {
        DB::migrate(self.db.pool()).await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        DB::claim(self, req).await
    }

    async fn complete(
        &self,
        scope: &Scope,
        token: FencingToken,
        completion: &Completion,
    ) -> Result<bool, StoreError> {
        let write = FencedWrite::Complete(completion);
        let mut conn = self.db.connection().await?;
        let done = DB::fenced_write(&mut conn, scope, token, write, &self.clock).await?;
        conn.done().await?;
        Ok(done)
    }

    async fn renew(
        &self,
        scope: &Scope,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let write = FencedWrite::Renew(lease);
        let mut conn = self.db.connection().await?;
        let done = DB::fenced_write(&mut conn, scope, token, write, &self.clock).await?;
        conn.done().await?;
        Ok(done)
    }

    async fn release(&self, scope: &Scope, token: FencingToken) -> Result<bool, StoreError> {
        let mut conn = self.db.connection().await?;
        let done =
            DB::fenced_write(&mut conn, scope, token, FencedWrite::Release, &self.clock).await?;
        conn.done().await?;
        Ok(done)
    }

    fn now(&self) -> std::time::SystemTime {
        self.clock.now()
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let mut conn = self.db.connection().await?;
        let read_at = whole_millis(self.clock.now());
        let row = DB::select(&mut conn, scope, DB::now(&self.clock)).await?;
        conn.done().await?;
        let found = row.map(|row| row.into_found(read_at)).transpose()?;
        Ok(found.filter(|f| !f.expired).map(|f| f.record))
    }

    async fn prune(&self, limit: u32) -> Result<u64, StoreError> {
        let mut conn = self.db.connection().await?;
        let pruned = DB::prune_on(&mut conn, limit, &self.clock).await?;
        conn.done().await?;
        Ok(pruned)
    }

    async fn claim_in_transaction(
        &self,
        req: &ClaimRequest<'_>,
        wait: Duration,
    ) -> Result<Claim<KeyTransaction<DB>>, StoreError> {
        let mut tx = match DB::begin_claim(&self.db, req, wait).await {
            Ok(tx) => tx,
            Err(error) => return DB::contended(&self.held, req.scope, error),
        };
        match DB::claim_on(&mut tx, req, &self.clock).await {
            Ok(Claim::Acquired { token, .. }) => Ok(Claim::Acquired {
                token,
                tx: KeyTransaction::holding(tx, DB::hold(&self.held, req.scope)),
            }),
            Ok(Claim::Existing(record)) => Ok(Claim::Existing(record)),
            Ok(Claim::Busy) => Ok(Claim::Busy),
            Err(StoreError::Database(error)) => DB::contended(&self.held, req.scope, error),
            Err(error) => Err(error),
        }
    }

    async fn complete_in_transaction(
        &self,
        tx: &mut Transaction<'static, DB>,
        scope: &Scope,
        token: FencingToken,
        completion: &Completion,
    ) -> Result<bool, StoreError> {
        let write = FencedWrite::Complete(completion);
        DB::fenced_write(tx, scope, token, write, &self.clock).await
    }
}

/// The statements run over sqlx's generic API: written once, for every [`Dialect`] whose sqlx
/// driver binds and reads the types the store uses. (Not a supertrait of `Dialect`: the blanket
/// implementation below needs `Dialect`, and a cycle would hide its futures' `Send`.)
pub trait Queries: Dialect {
    /// Applies the dialect's migrations.
    fn migrate(pool: &Pool<Self>) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The claim algorithm, on any connection (autocommit or inside a transaction): the claim
    /// statement; take over if allowed; ask again if the row changed underneath.
    fn claim_on(
        conn: &mut Self::Connection,
        req: &ClaimRequest<'_>,
        clock: &Clock,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// A claim statement (CLAIM or TAKEOVER) with its parameters bound.
    fn claim_query(
        sql: &'static str,
        args: &ClaimArgs<'_, Self>,
    ) -> Query<'static, Self, Self::Arguments>;

    /// Runs a claim statement that returns no row; whether it wrote the key's row.
    fn execute_claim(
        conn: &mut Self::Connection,
        sql: &'static str,
        args: &ClaimArgs<'_, Self>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Reads the key's row (SELECT).
    fn select(
        conn: &mut Self::Connection,
        scope: &Scope,
        now: Self::Now,
    ) -> impl Future<Output = Result<Option<KeyRow>, StoreError>> + Send;

    /// A write to the key's row by the claim `token` (COMPLETE, RENEW or RELEASE); whether the
    /// claim still owned the key.
    fn fenced_write(
        conn: &mut Self::Connection,
        scope: &Scope,
        token: FencingToken,
        write: FencedWrite<'_>,
        clock: &Clock,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes up to `limit` expired rows (PRUNE).
    fn prune_on(
        conn: &mut Self::Connection,
        limit: u32,
        clock: &Clock,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// A statement that starts with the scope's parameters: 1 tenant, 2 method, 3 route, 4 key.
fn scoped<DB>(sql: &'static str, scope: &Scope) -> Query<'static, DB, DB::Arguments>
where
    DB: Database,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
{
    sqlx::query(sql)
        .bind(scope.tenant.as_str())
        .bind(scope.method.as_str())
        .bind(scope.route.as_str())
        .bind(scope.key.as_str())
}

impl<DB> Queries for DB
where
    DB: Dialect,
    DB::Connection: Migrate,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    for<'a> Option<&'a [u8]>: Encode<'a, DB> + Type<DB>,
    for<'a> Uuid: Encode<'a, DB> + Type<DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
    for<'a> Option<i64>: Encode<'a, DB> + Type<DB>,
    for<'a> Option<String>: Encode<'a, DB> + Type<DB>,
    for<'r> KeyRow: sqlx::FromRow<'r, DB::Row>,
{
    async fn migrate(pool: &Pool<Self>) -> Result<(), StoreError> {
        DB::migrator().run(pool).await?;
        Ok(())
    }

    async fn claim_on(
        conn: &mut DB::Connection,
        req: &ClaimRequest<'_>,
        clock: &Clock,
    ) -> Result<Claim, StoreError> {
        let read_at = whole_millis(clock.now());
        let now = DB::now(clock);
        for _ in 0..8 {
            let args = ClaimArgs {
                req,
                token: FencingToken::new(),
                now,
            };
            let found = match DB::insert_or_read(conn, &args).await? {
                InsertOrRead::Inserted => {
                    return Ok(Claim::Acquired {
                        token: args.token,
                        tx: (),
                    });
                }
                InsertOrRead::Raced => continue,
                InsertOrRead::Found(row) => row.into_found(read_at)?,
            };
            if !found.claimable_by(req.fingerprint) {
                return Ok(Claim::Existing(found.record));
            }
            // The guard is re-checked under the row lock: of two racing takeovers one wins.
            if DB::execute_claim(conn, DB::STATEMENTS.takeover, &args).await? {
                return Ok(Claim::Acquired {
                    token: args.token,
                    tx: (),
                });
            }
        }
        Err(StoreError::Corrupt("key row kept changing during claim"))
    }

    fn claim_query(
        sql: &'static str,
        args: &ClaimArgs<'_, DB>,
    ) -> Query<'static, DB, DB::Arguments> {
        scoped(sql, args.req.scope)
            .bind(&args.req.fingerprint.as_bytes()[..])
            .bind(args.token.0)
            .bind(millis(args.req.lease))
            .bind(millis(args.req.retention))
            .bind(args.now)
    }

    async fn execute_claim(
        conn: &mut DB::Connection,
        sql: &'static str,
        args: &ClaimArgs<'_, DB>,
    ) -> Result<bool, StoreError> {
        let done = Self::claim_query(sql, args).execute(conn).await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn select(
        conn: &mut DB::Connection,
        scope: &Scope,
        now: DB::Now,
    ) -> Result<Option<KeyRow>, StoreError> {
        let row = scoped(DB::STATEMENTS.select, scope)
            .bind(now)
            .try_map(|row: DB::Row| <KeyRow as sqlx::FromRow<DB::Row>>::from_row(&row))
            .fetch_optional(conn)
            .await?;
        Ok(row)
    }

    async fn fenced_write(
        conn: &mut DB::Connection,
        scope: &Scope,
        token: FencingToken,
        write: FencedWrite<'_>,
        clock: &Clock,
    ) -> Result<bool, StoreError> {
        let statements = &DB::STATEMENTS;
        let query = match write {
            FencedWrite::Complete(completion) => {
                let c = CompletionColumns::from(completion);
                scoped(statements.complete, scope)
                    .bind(token.0)
                    .bind(c.state)
                    .bind(c.status)
                    .bind(c.headers)
                    .bind(c.body)
                    .bind(c.reason)
                    .bind(DB::now(clock))
            }
            FencedWrite::Renew(lease) => scoped(statements.renew, scope)
                .bind(token.0)
                .bind(millis(lease))
                .bind(DB::now(clock)),
            FencedWrite::Release => scoped(statements.release, scope).bind(token.0),
        };
        let done = query.execute(conn).await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn prune_on(
        conn: &mut DB::Connection,
        limit: u32,
        clock: &Clock,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(DB::STATEMENTS.prune)
            .bind(DB::now(clock))
            .bind(i64::from(limit))
            .execute(conn)
            .await?;
        Ok(DB::rows_affected(&done))
    }
}

/// `at`, rounded down to the millisecond: the time of a read, no later than the clock the
/// statement bound (SQLite binds whole milliseconds), so that the expiry reckoned from it is
/// never later than the row's.
fn whole_millis(at: std::time::SystemTime) -> std::time::SystemTime {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let millis = Duration::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
    std::time::UNIX_EPOCH + millis
}
