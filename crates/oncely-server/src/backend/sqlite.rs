//! SQLite: the embedded default. One process owns the file, so times come from its clock
//! (Unix milliseconds).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use oncely::store::sqlite::{SqliteKeyStore, connect_options};
use oncely_outbox::store::sqlite::SqliteJobStore;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions, SqliteQueryResult};
use time::OffsetDateTime;

use oncely_sql::Db;

use super::{Backend, Create, DevInboxHold, Location, Pooler, Stores};

/// The SQLite backend.
#[derive(Debug, Clone)]
pub struct Sqlite(Stores<SqliteKeyStore>);

impl Sqlite {
    /// The folder of the file `url` names, if it names one (not `sqlite::memory:`, not a file
    /// in the working directory, not another database).
    pub fn directory(url: &str) -> Option<PathBuf> {
        url.strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .map(|path| path.split('?').next().unwrap_or(path))
            .and_then(|path| Path::new(path).parent().map(Path::to_path_buf))
            .filter(|dir| !dir.as_os_str().is_empty())
    }
}

impl Backend for Sqlite {
    const NAME: &'static str = "sqlite";
    type Database = sqlx::Sqlite;
    // Unix milliseconds; "now" is read here, from the process clock.
    type Instant = i64;
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";
    type Keys = SqliteKeyStore;
    type Jobs = SqliteJobStore;
    // WAL with `synchronous = NORMAL`: a commit survives a crash of the process, not always a
    // power loss — what PRODUCTION_WARNING's single machine already says.
    const LOSES_ACKNOWLEDGED_COMMITS: Option<&'static str> = None;
    const PRODUCTION_WARNING: Option<&'static str> = Some(
        "production on SQLite: every serve and worker must run on this machine, on this one file; more machines need PostgreSQL",
    );

    fn accepts(url: &str) -> bool {
        url.starts_with("sqlite:")
    }

    fn migrators() -> [Migrator; 3] {
        super::migrators!(sqlite, "./migrations/sqlite")
    }

    /// At most 8 connections: one writer at a time anyway.
    async fn open(at: &Location, max_connections: u32, create: Create) -> anyhow::Result<Self> {
        // No setting is dropped silently: these are PostgreSQL's.
        if at.direct_url.is_some() {
            bail!("ONCELY_DATABASE_DIRECT_URL is for PostgreSQL; DATABASE_URL names SQLite");
        }
        if at.pooler != Pooler::None {
            bail!("ONCELY_DATABASE_POOLER is for PostgreSQL; DATABASE_URL names SQLite");
        }
        let url = at.url.as_str();
        let mut options = connect_options(url)
            .map_err(|e| anyhow::anyhow!("DATABASE_URL={url}: {e}"))?
            .create_if_missing(create == Create::IfMissing);
        // An operator's one-off command (`tenant set` while `serve` runs) waits for the one
        // write lock longer than a request may: the service's writers hold it in bursts, and a
        // command has no client waiting on it.
        if max_connections == super::COMMAND_POOL {
            options = options.busy_timeout(std::time::Duration::from_secs(30));
        }
        if let Some(file) = file_of(url, &options) {
            let directory = match file.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            };
            if !directory.is_dir() {
                bail!(
                    "DATABASE_URL={url}: the directory {} does not exist (create it, or fix DATABASE_URL)",
                    directory.display()
                );
            }
            if create == Create::Never && !file.exists() {
                bail!(
                    "DATABASE_URL={url}: there is no database file {}: is DATABASE_URL right? run `oncely migrate`",
                    file.display()
                );
            }
            // An empty file (`touch oncely.db`) is no database yet: opening it would write one
            // (the WAL header) before the schema check refused it.
            if create == Create::Never && file.metadata().is_ok_and(|m| m.len() == 0) {
                bail!(
                    "DATABASE_URL={url}: the file {} is empty, no database: is DATABASE_URL right? run `oncely migrate`",
                    file.display()
                );
            }
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .map_err(|e| anyhow::anyhow!("DATABASE_URL={url}: cannot open the database: {e}"))?;
        Ok(Self(Stores::new(Db::direct(pool), SqliteKeyStore::on)))
    }

    fn has_table(table: &str) -> String {
        format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{table}'")
    }

    async fn hold_dev_inbox(&self, description: &str) -> anyhow::Result<DevInboxHold> {
        let options = self.pool().connect_options();
        let file = options.get_filename();
        if file.to_string_lossy().starts_with("file:sqlx-in-memory") || !file.exists() {
            // An in-memory database is this process's alone.
            return Ok(DevInboxHold::Held(Box::new(())));
        }
        // A lock on a file beside the database: the system releases it when the process
        // ends, however it ends; the file keeps the last holder's description. Beside the
        // file itself, however the path to it is spelled (`./`, a symbolic link).
        let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
        let mut path = file.as_os_str().to_owned();
        path.push(".dev-inbox");
        let path = PathBuf::from(path);
        let mut lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        match lock.try_lock() {
            Ok(()) => {
                use std::io::Write;
                lock.set_len(0)?;
                lock.write_all(description.as_bytes())?;
                Ok(DevInboxHold::Held(Box::new(lock)))
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                Ok(DevInboxHold::Elsewhere(if holder.trim().is_empty() {
                    "another process".to_owned()
                } else {
                    holder.trim().to_owned()
                }))
            }
            Err(std::fs::TryLockError::Error(error)) => {
                Err(anyhow::Error::new(error).context(format!("locking {}", path.display())))
            }
        }
    }

    fn stores(&self) -> &Stores<SqliteKeyStore> {
        &self.0
    }

    /// `poll_only` has no meaning here: in-process workers are signalled, never LISTEN.
    fn jobs(&self, _poll_only: bool) -> SqliteJobStore {
        SqliteJobStore::on(self.db().clone())
    }

    fn at(at: Option<OffsetDateTime>) -> i64 {
        let at = at.unwrap_or_else(OffsetDateTime::now_utc);
        i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
    }

    fn rows_affected(result: &SqliteQueryResult) -> u64 {
        result.rows_affected()
    }
}

/// [`super::cannot_serve_now`] for an error SQLite returned.
pub(super) fn cannot_serve_now(error: &dyn sqlx::error::DatabaseError) -> bool {
    // SQLITE_BUSY and SQLITE_LOCKED with their extended codes (5, 261, 517, 6, 262, …):
    // the write lock was not free within the busy timeout.
    let primary = error
        .code()
        .and_then(|code| code.parse::<i32>().ok())
        .map(|code| code & 0xff);
    matches!(primary, Some(5 | 6))
}

/// The file a SQLite URL names, unless it is an in-memory database.
fn file_of(url: &str, options: &SqliteConnectOptions) -> Option<PathBuf> {
    let memory = url.contains(":memory:") || url.contains("mode=memory");
    (!memory).then(|| options.get_filename().to_path_buf())
}
