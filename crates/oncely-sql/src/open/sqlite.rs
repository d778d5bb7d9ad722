//! Opening SQLite: the embedded default. One process owns the file; a missing file, folder or an
//! empty file is said as such, and an operator's command waits longer for the write lock.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::{COMMAND_POOL, Create, Location, Open, Opened, Pooler, StartError, refuse};
use crate::Db;

/// Options that suit oncely's stores: WAL (readers never block the writer), `synchronous =
/// NORMAL` (durable at each checkpoint, safe against application crashes), a busy timeout,
/// foreign keys, and the file created if missing.
pub fn connect_options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    Ok(SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5))
        .foreign_keys(true))
}

/// The folder of the file `url` names, if it names one (not `sqlite::memory:`, not a file in
/// the working directory, not another database).
pub fn directory(url: &str) -> Option<PathBuf> {
    url.strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .map(|path| path.split('?').next().unwrap_or(path))
        .and_then(|path| Path::new(path).parent().map(Path::to_path_buf))
        .filter(|dir| !dir.as_os_str().is_empty())
}

impl Open for Sqlite {
    const NAME: &'static str = "sqlite";
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";
    // WAL with `synchronous = NORMAL`: a commit survives a crash of the process, not always a
    // power loss — what PRODUCTION_WARNING's single machine already says.
    const LOSES_ACKNOWLEDGED_COMMITS: Option<&'static str> = None;
    const PRODUCTION_WARNING: Option<&'static str> = Some(
        "production on SQLite: every serve and worker must run on this machine, on this one file; more machines need PostgreSQL",
    );

    fn accepts(url: &str) -> bool {
        url.starts_with("sqlite:")
    }

    /// At most 8 connections: one writer at a time anyway.
    async fn open(
        at: &Location,
        max_connections: u32,
        create: Create,
    ) -> Result<Opened<Self>, StartError> {
        // No setting is dropped silently: these are PostgreSQL's.
        if at.direct_url.is_some() {
            refuse!("ONCELY_DATABASE_DIRECT_URL is for PostgreSQL; DATABASE_URL names SQLite");
        }
        if at.pooler != Pooler::None {
            refuse!("ONCELY_DATABASE_POOLER is for PostgreSQL; DATABASE_URL names SQLite");
        }
        let url = at.url.as_str();
        let mut options = connect_options(url)
            .map_err(|e| StartError::new(format!("DATABASE_URL={url}: {e}")))?
            .create_if_missing(create == Create::IfMissing);
        // An operator's one-off command (`tenant set` while `serve` runs) waits for the one
        // write lock longer than a request may: the service's writers hold it in bursts, and a
        // command has no client waiting on it.
        if max_connections == COMMAND_POOL {
            options = options.busy_timeout(Duration::from_secs(30));
        }
        if let Some(file) = file_of(url, &options) {
            let directory = match file.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            };
            if !directory.is_dir() {
                refuse!(
                    "DATABASE_URL={url}: the directory {} does not exist (create it, or fix DATABASE_URL)",
                    directory.display()
                );
            }
            if create == Create::Never && !file.exists() {
                refuse!(
                    "DATABASE_URL={url}: there is no database file {}: is DATABASE_URL right? run `oncely migrate`",
                    file.display()
                );
            }
            // An empty file (`touch oncely.db`) is no database yet: opening it would write one
            // (the WAL header) before the schema check refused it.
            if create == Create::Never && file.metadata().is_ok_and(|m| m.len() == 0) {
                refuse!(
                    "DATABASE_URL={url}: the file {} is empty, no database: is DATABASE_URL right? run `oncely migrate`",
                    file.display()
                );
            }
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .map_err(|e| {
                StartError::new(format!("DATABASE_URL={url}: cannot open the database: {e}"))
            })?;
        Ok(Opened {
            db: Db::direct(pool),
            location: at.clone(),
            #[cfg(feature = "postgres")]
            direct: None,
            listen: None,
        })
    }

    fn has_table(table: &str) -> String {
        format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{table}'")
    }

    async fn scalar(db: &Db<Self>, sql: String) -> Result<i64, sqlx::Error> {
        super::scalar_on(db, sql).await
    }

    async fn execute(db: &Db<Self>, sql: String) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(db).await?;
        Ok(done.rows_affected())
    }
}

/// The file a SQLite URL names, unless it is an in-memory database.
fn file_of(url: &str, options: &SqliteConnectOptions) -> Option<PathBuf> {
    let memory = url.contains(":memory:") || url.contains("mode=memory");
    (!memory).then(|| options.get_filename().to_path_buf())
}
