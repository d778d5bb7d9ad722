//! Opening a process's database: where it is ([`Location`]: `DATABASE_URL`, what stands in
//! between, the URL straight to the server), how each dialect opens it ([`Open`], implemented
//! for `sqlx::Postgres` and `sqlx::Sqlite`); the histories of the migrations that made its
//! schema are the `schema` module's, which builds on this one. The service (`oncely serve`,
//! `worker`, the operator commands) and the gateway open their databases here, each with its own
//! migrations.
//!
//! Every error is one line for people ([`StartError`]): it names the setting (`DATABASE_URL`,
//! never its password), what was wrong, and what to do.

use std::fmt;
use std::future::Future;

use sqlx::migrate::Migrate;
use sqlx::{Database, Pool};

use crate::Db;

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "sqlite")]
pub use sqlite::{connect_options, directory};

/// Why a process cannot start on its database: one line that names the setting and says what
/// to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError(String);

impl StartError {
    /// The line.
    pub fn new(line: impl Into<String>) -> Self {
        Self(line.into())
    }
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

/// Returns early with a [`StartError`] made like `format!`.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err($crate::open::StartError::new(format!($($arg)*)))
    };
}
pub(crate) use refuse;

/// What stands between oncely and PostgreSQL (`ONCELY_DATABASE_POOLER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// Nothing, or a TCP proxy (HAProxy): each connection is one server session.
    #[default]
    None,
    /// A pooler in session mode (PgBouncer's `pool_mode = session`): the same as `none`.
    Session,
    /// A pooler in transaction mode (PgBouncer's `pool_mode = transaction`, Supabase's port
    /// 6543, RDS Proxy, Neon's pooled host): every statement runs in a transaction, nothing is
    /// prepared across transactions, settings are set per transaction; LISTEN, the dev inbox's
    /// lock and migrations need `ONCELY_DATABASE_DIRECT_URL` (workers poll without it).
    Transaction,
}

impl Pooler {
    /// Every kind, as written in `ONCELY_DATABASE_POOLER`.
    pub const ALL: [Self; 3] = [Self::None, Self::Session, Self::Transaction];

    /// As written in `ONCELY_DATABASE_POOLER`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }

    /// What it means, for `--help`.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::None => {
                "Nothing, or a TCP proxy (HAProxy): each connection is one server session"
            }
            Self::Session => {
                "A pooler in session mode (PgBouncer's `pool_mode = session`): the same as `none`"
            }
            Self::Transaction => {
                "A pooler in transaction mode (PgBouncer's `pool_mode = transaction`, Supabase's port 6543, RDS Proxy, Neon's pooled host): every statement runs in a transaction, nothing is prepared across transactions, settings are set per transaction; LISTEN, the dev inbox's lock and migrations need `ONCELY_DATABASE_DIRECT_URL` (workers poll without it)"
            }
        }
    }
}

/// Where the database is: `DATABASE_URL`, and for PostgreSQL what stands in between and the
/// URL straight to the server.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Location {
    /// `DATABASE_URL`.
    pub url: String,
    /// `ONCELY_DATABASE_DIRECT_URL`: straight to the server, for what needs one session
    /// (LISTEN, advisory locks, migrations).
    pub direct_url: Option<String>,
    /// `ONCELY_DATABASE_POOLER`.
    pub pooler: Pooler,
}

impl Location {
    /// `url`, with nothing in between.
    pub fn url(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Location")
            .field("url", &redact(&self.url))
            .field("direct_url", &self.direct_url.as_deref().map(redact))
            .field("pooler", &self.pooler)
            .finish()
    }
}

/// Whether opening a SQLite database creates its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// Create it (`oncely migrate`; `serve`, `worker` and `gateway` in development; tests).
    IfMissing,
    /// A missing file is an error that says to check `DATABASE_URL` and run `oncely migrate`.
    Never,
}

/// The pool of one-off commands (`oncely migrate`, `prune`, `outbox …`, `tenant …`): a few
/// connections, and on SQLite a wait for the write lock longer than a request's (the service's
/// writers hold it in bursts; a command has no client waiting on it).
pub const COMMAND_POOL: u32 = 4;

/// An open database: its pool as every statement uses it, and where it is.
#[derive(Debug)]
pub struct Opened<DB: Database> {
    /// The pool as every statement uses it.
    pub db: Db<DB>,
    /// Where it is.
    pub location: Location,
    /// `ONCELY_DATABASE_DIRECT_URL`, read.
    #[cfg(feature = "postgres")]
    direct: Option<crate::postgres::Target>,
    /// Where a listener connects behind a transaction-mode pooler: a pool on the direct URL
    /// that opens no connection itself (the listener reads where it points, which follows the
    /// primary among its hosts).
    pub listen: Option<Pool<DB>>,
}

impl<DB: Database> Clone for Opened<DB> {
    fn clone(&self) -> Self {
        Self {
            db: self.db.clone(),
            location: self.location.clone(),
            #[cfg(feature = "postgres")]
            direct: self.direct.clone(),
            listen: self.listen.clone(),
        }
    }
}

/// How a process opens a database of this dialect: `sqlx::Postgres` or `sqlx::Sqlite`.
pub trait Open: Database<Connection: Migrate> + Sized {
    /// A name for logs: `postgres` or `sqlite`.
    const NAME: &'static str;

    /// How a transaction that writes begins (outside the idempotency layer's): SQLite's takes
    /// the write lock at once, so that a read before its first write cannot make it fail busy.
    const BEGIN_WRITE: &'static str;

    /// What production on this database should know, logged when it starts there.
    const PRODUCTION_WARNING: Option<&'static str>;

    /// A statement whose one number is 1 if commits are acknowledged before they are durable
    /// (PostgreSQL's `synchronous_commit` off or local), else 0; `None`: nothing to ask.
    const LOSES_ACKNOWLEDGED_COMMITS: Option<&'static str>;

    /// Whether `url` names this database (by its scheme).
    fn accepts(url: &str) -> bool;

    /// Opens the database `at` with at most `max_connections` connections (where the database
    /// has a server to spare; [`COMMAND_POOL`]: an operator's command); `create` says whether a
    /// missing SQLite file is made (`oncely migrate`, development) or is an error (every other
    /// command: a mistyped `DATABASE_URL` must not leave an empty database behind). The first
    /// connection is made at once, for its error.
    fn open(
        at: &Location,
        max_connections: u32,
        create: Create,
    ) -> impl Future<Output = Result<Opened<Self>, StartError>> + Send;

    /// Where migrations run: one session that waits for locks as long as it takes (a migration
    /// waits for another process's migration, or for a table's lock, rather than fail the
    /// deploy), straight to the server (never through a pooler in transaction mode). Closed by
    /// [`Open::done_migrating`].
    fn migration_pool(
        opened: &Opened<Self>,
    ) -> impl Future<Output = Result<Pool<Self>, StartError>> + Send {
        std::future::ready(Ok(opened.db.pool().clone()))
    }

    /// Ends what [`Open::migration_pool`] opened (nothing where it was the pool itself).
    fn done_migrating(_pool: Pool<Self>) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// A statement whose one number is 1 if `table` exists (in the schema the migrations create
    /// their tables in), else 0.
    fn has_table(table: &str) -> String;

    /// The one number `sql` returns.
    fn scalar(db: &Db<Self>, sql: String) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;

    /// Runs `sql`; the rows it changed.
    fn execute(db: &Db<Self>, sql: String)
    -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
}

/// [`Open::scalar`], in any dialect whose pool runs statements.
async fn scalar_on<DB: Database>(db: &Db<DB>, sql: String) -> Result<i64, sqlx::Error>
where
    for<'c> &'c Db<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    i64: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(db)
        .await
}

/// Warns when the database acknowledges commits it may lose in a crash (`synchronous_commit =
/// off`): an acknowledged signup or key could vanish, and an outbox attempt's point of no return
/// be forgotten after its email left — then sent again.
pub async fn warn_if_commits_are_not_durable<DB: Open>(db: &Db<DB>) -> Result<(), sqlx::Error> {
    if let Some(statement) = DB::LOSES_ACKNOWLEDGED_COMMITS
        && DB::scalar(db, statement.to_owned()).await? > 0
    {
        tracing::warn!(
            "synchronous_commit is off on this database: a crash can lose commits oncely already acknowledged — a signup answered 202, an email's point of no return (then sent twice); set it to on (the default) for oncely's role or database"
        );
    }
    Ok(())
}

/// The error for a `DATABASE_URL` no dialect accepts.
pub fn unsupported(url: &str) -> StartError {
    StartError::new(format!(
        "DATABASE_URL must start with postgres:// or sqlite:// (got {})",
        redact(url)
    ))
}

/// The URL with any password (in the user info or a `password=` parameter) replaced, for
/// messages.
pub fn redact(url: &str) -> String {
    let mut out = match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    };
    if let Some(at) = out.find("password=") {
        let start = at + "password=".len();
        let end = out[start..].find('&').map_or(out.len(), |e| start + e);
        out.replace_range(start..end, "***");
    }
    out
}
#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://u:hunter2@h:5432/d"),
            "postgres://u:***@h:5432/d"
        );
        assert_eq!(redact("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(redact("sqlite://x.db"), "sqlite://x.db");
        assert_eq!(
            redact("postgres://h/d?sslmode=require&password=hunter2&x=1"),
            "postgres://h/d?sslmode=require&password=***&x=1"
        );
    }
}
