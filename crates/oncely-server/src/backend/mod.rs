//! The backend seam: the database is chosen once, by the scheme of `DATABASE_URL`, in `main`,
//! which then runs everything generic over one [`Backend`] — PostgreSQL ([`Postgres`]) or
//! SQLite ([`Sqlite`]).
//!
//! A backend carries everything that differs between the two databases: how to connect (pool
//! options), the idempotency key store and outbox job store on that database, how it stores an
//! instant, and which errors mean it is unavailable. Everything else — migrations, the account
//! logic and readiness (account storage, which brings its statements per dialect and implements
//! itself once for every backend), the app, the workers, the operator commands — is written
//! once, generic over it: code that needs account storage asks for `B: Accounts` (every backend
//! is), code that needs only the stores for `B: Backend`. Nothing outside `backend/postgres.rs` and `backend/sqlite.rs` asks which
//! database it runs on, except `main`, once.

use std::future::Future;

use oncely::store::KeyStore;
use oncely::store::shared_secret::SharedSecretStore;
use oncely_outbox::JobStore;
use oncely_sql::Db;
pub use oncely_sql::open::{
    COMMAND_POOL, Create, Location, Open, Opened, Pooler, redact, unsupported,
};
use oncely_sql::schema::Library;
use sqlx::migrate::Migrator;
use time::OffsetDateTime;

mod postgres;
mod sqlite;

pub use postgres::Postgres;
pub use sqlite::Sqlite;

/// The connection type of a backend's database (what the idempotency layer's transaction
/// hands to handlers).
pub type Connection<B> = <<B as Backend>::Database as sqlx::Database>::Connection;

/// One database the service runs on. Implemented once per database, in `backend/postgres.rs`
/// and `backend/sqlite.rs`; everything else is generic over it. How it opens, and its
/// migration histories' tables, are `oncely_sql`'s ([`Open`], [`oncely_sql::schema`]), shared
/// with the gateway.
pub trait Backend: Clone + Send + Sync + 'static {
    /// A name for logs: `postgres` or `sqlite`.
    const NAME: &'static str = <Self::Database as Open>::NAME;

    /// The sqlx database, and how it opens.
    type Database: Open;

    /// The idempotency key store on this database (where the shared secret's check is kept).
    type Keys: KeyStore<Database = Self::Database> + SharedSecretStore;

    /// The outbox job store on this database.
    type Jobs: JobStore<Database = Self::Database>;

    /// An instant as this database's account statements take it (see [`Self::at`]).
    type Instant: for<'q> sqlx::Encode<'q, Self::Database> + sqlx::Type<Self::Database> + Send;

    /// How a transaction that writes begins on the pool (outside the idempotency layer's):
    /// SQLite's takes the write lock at once, so that a read before its first write cannot
    /// make it fail busy.
    const BEGIN_WRITE: &'static str = <Self::Database as Open>::BEGIN_WRITE;

    /// Whether `url` names this database (by its scheme).
    fn accepts(url: &str) -> bool {
        <Self::Database as Open>::accepts(url)
    }

    /// Connects with at most `max_connections` connections (where the database has a server
    /// to spare), creating a SQLite file that does not exist yet; the error is one line that
    /// names `DATABASE_URL` (never its password) and says what was wrong.
    fn connect(
        at: &Location,
        max_connections: u32,
    ) -> impl Future<Output = anyhow::Result<Self>> + Send {
        Self::open(at, max_connections, Create::IfMissing)
    }

    /// [`connect`](Self::connect), with `create` saying whether a missing SQLite file is made
    /// (`oncely migrate`, development) or is an error (every other command: a mistyped
    /// `DATABASE_URL` must not leave an empty database behind).
    fn open(
        at: &Location,
        max_connections: u32,
        create: Create,
    ) -> impl Future<Output = anyhow::Result<Self>> + Send {
        async move {
            let opened = <Self::Database as Open>::open(at, max_connections, create).await?;
            Ok(Self::on(opened))
        }
    }

    /// The backend on an open database.
    fn on(opened: Opened<Self::Database>) -> Self;

    /// Holds the dev inbox of this database for this process while the returned hold lives,
    /// unless another process holds it: then what that process wrote as `description`. A
    /// crashed holder holds nothing (SQLite: a lock on a file beside the database; PostgreSQL:
    /// an advisory lock of a session of its own).
    fn hold_dev_inbox(
        &self,
        description: &str,
    ) -> impl Future<Output = anyhow::Result<DevInboxHold>> + Send;

    /// The open database and the key store.
    fn stores(&self) -> &Stores<Self::Keys>;

    /// A new outbox store on this database. The app makes one and shares it (workers and the
    /// post-commit wake-up must use the same one). `poll_only`: workers do not LISTEN
    /// (PostgreSQL behind a transaction-mode pooler).
    fn jobs(&self, poll_only: bool) -> Self::Jobs;

    /// The migrations of the three histories: idempotency keys, outbox, accounts.
    fn migrators() -> [Migrator; 3];

    /// The three histories, named for people.
    fn libraries() -> [Library; 3] {
        let [keys, outbox, accounts] = Self::migrators();
        let [k, o, a] = MIGRATION_LIBRARIES;
        [
            Library {
                name: k,
                migrator: keys,
            },
            Library {
                name: o,
                migrator: outbox,
            },
            Library {
                name: a,
                migrator: accounts,
            },
        ]
    }

    /// `at` as the account statements bind it; `None` is "now" by this database's clock.
    fn at(at: Option<OffsetDateTime>) -> Self::Instant;

    /// Rows a statement changed.
    fn rows_affected(result: &<Self::Database as sqlx::Database>::QueryResult) -> u64;

    /// The open database.
    fn opened(&self) -> &Opened<Self::Database> {
        &self.stores().opened
    }

    /// The pool (for what needs the pool itself; statements go through [`Backend::db`]).
    fn pool(&self) -> &sqlx::Pool<Self::Database> {
        self.db().pool()
    }

    /// The pool as every statement uses it: single statements (`&Db` is an executor) and
    /// transactions ([`Db::begin_with`]) right for what is in between (see [`Pooler`]).
    fn db(&self) -> &Db<Self::Database> {
        &self.stores().opened.db
    }

    /// The idempotency key store.
    fn keys(&self) -> &Self::Keys {
        &self.stores().keys
    }
}

/// Whether `error` means the database cannot serve now, whichever database returned it:
/// unreachable, its connection gone, out of connections, shutting down, its write lock
/// (SQLite) or a lock another transaction holds (PostgreSQL, past the request's
/// `lock_timeout`) not free in time, a deadlock PostgreSQL broke by ending this transaction —
/// rather than that the statement failed. Nothing the statement did was kept; the same
/// request may succeed later (503 with `Retry-After`).
pub fn cannot_serve_now(error: &sqlx::Error) -> bool {
    use sqlx::Error as E;
    match error {
        // A session that is not what `target_session_attrs` asks for (any database type).
        E::Database(e) if e.code().as_deref() == Some(oncely_sql::READ_ONLY) => true,
        E::Database(e) => {
            let e = e.as_ref();
            if e.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some()
            {
                postgres::cannot_serve_now(e)
            } else if e.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                sqlite::cannot_serve_now(e)
            } else {
                false
            }
        }
        E::Io(_) | E::Tls(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => true,
        _ => false,
    }
}

/// Who serves the dev inbox of a database (see [`Backend::hold_dev_inbox`]).
pub enum DevInboxHold {
    /// This process, while this value lives.
    Held(Box<dyn Send + Sync>),
    /// Another process, which described itself so.
    Elsewhere(String),
}

impl std::fmt::Debug for DevInboxHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Held(_) => f.write_str("Held"),
            Self::Elsewhere(by) => f.debug_tuple("Elsewhere").field(by).finish(),
        }
    }
}

/// What a connected backend holds: the open database, and the idempotency key store on it.
#[derive(Debug)]
pub struct Stores<K: KeyStore> {
    opened: Opened<K::Database>,
    keys: K,
}

impl<K: KeyStore> Clone for Stores<K> {
    fn clone(&self) -> Self {
        Self {
            opened: self.opened.clone(),
            keys: self.keys.clone(),
        }
    }
}

impl<K: KeyStore> Stores<K> {
    /// The key store `keys` makes on the pool of `opened`, beside it.
    pub fn new(opened: Opened<K::Database>, keys: impl FnOnce(Db<K::Database>) -> K) -> Self {
        Self {
            keys: keys(opened.db.clone()),
            opened,
        }
    }
}

/// What each history holds, for people: in the order of [`MIGRATION_TABLES`].
pub const MIGRATION_LIBRARIES: [&str; 3] = ["idempotency keys", "outbox", "accounts"];

/// The migration history tables: idempotency keys, outbox, accounts (the service's own).
pub const MIGRATION_TABLES: [&str; 3] = [
    "_oncely_idempotency_migrations",
    "_oncely_outbox_migrations",
    ACCOUNT_MIGRATIONS_TABLE,
];

/// The migrators of one dialect (the module of each library, the folder of the service's own):
/// `[idempotency keys, outbox, accounts]`.
macro_rules! migrators {
    ($dialect:ident, $accounts:literal) => {
        [
            oncely::store::$dialect::migrator(),
            oncely_outbox::store::$dialect::migrator(),
            $crate::backend::account_migrator(sqlx::migrate!($accounts)),
        ]
    };
}
use migrators;

/// The history table of the service's own migrations.
pub const ACCOUNT_MIGRATIONS_TABLE: &str = "_oncely_server_migrations";

/// The service's migrations (`sqlx::migrate!` of one dialect's folder) with their own history
/// table.
pub(crate) fn account_migrator(mut migrator: Migrator) -> Migrator {
    migrator.dangerous_set_table_name(ACCOUNT_MIGRATIONS_TABLE);
    // Migrations only add: a process of the previous release must still start (and restart)
    // on a database a newer release already migrated, so versions it does not know are fine.
    migrator.set_ignore_missing(true);
    migrator
}
