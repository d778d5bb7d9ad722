//! SQLite: the embedded default. One process owns the file, so times come from its clock
//! (Unix milliseconds).

use std::path::PathBuf;

use anyhow::Context;
use oncely::store::sqlite::SqliteKeyStore;
use oncely_outbox::store::sqlite::SqliteJobStore;
use sqlx::migrate::Migrator;
use sqlx::sqlite::SqliteQueryResult;
use time::OffsetDateTime;

use super::{Backend, DevInboxHold, Opened, Stores};

/// The SQLite backend.
#[derive(Debug, Clone)]
pub struct Sqlite(Stores<SqliteKeyStore>);

impl Backend for Sqlite {
    type Database = sqlx::Sqlite;
    // Unix milliseconds; "now" is read here, from the process clock.
    type Instant = i64;
    type Keys = SqliteKeyStore;
    type Jobs = SqliteJobStore;
    fn migrators() -> [Migrator; 3] {
        super::migrators!(sqlite, "./migrations/sqlite")
    }

    fn on(opened: Opened<sqlx::Sqlite>) -> Self {
        Self(Stores::new(opened, SqliteKeyStore::on))
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
