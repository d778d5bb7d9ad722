//! The outbox on SQLite, the embedded default: [`SqliteJobStore`].
//!
//! Workers run in the process that owns the file, so an enqueue wakes the workers of its job's
//! kind with an in-process signal (the store's wake-up hub, shared with PostgreSQL), sent at
//! once — inside the enqueuing transaction. That is safe because SQLite has one writer: the
//! transaction holds the write lock from its first write until it ends, and a worker's claim
//! begins with `BEGIN IMMEDIATE`, so a woken worker's claim waits for the commit and then finds
//! the job (after a rollback it finds nothing: a harmless empty claim). A library user gets
//! prompt pickup without knowing about it.

use sqlx::migrate::Migrator;
use sqlx::{Sqlite, SqliteConnection};

use super::wakeups::Hub;
use super::{Clock, Dialect, OutboxError, SqlJobStore, Wakeup};

pub use super::MIGRATIONS_TABLE;

/// A job store on SQLite.
pub type SqliteJobStore = SqlJobStore<Sqlite>;

/// The outbox's migrations (in [`MIGRATIONS_TABLE`]).
pub fn migrator() -> Migrator {
    super::migrator(sqlx::migrate!("migrations/sqlite"))
}

/// How a [`SqliteJobStore`] wakes its process's workers: the hub every enqueue signals with its
/// job's kind. A worker that was busy when it was signalled sees it at its next wait.
#[derive(Debug, Default)]
pub struct SqliteWaker(Hub);

impl Dialect for Sqlite {
    /// Unix milliseconds.
    type Moment = i64;
    type Waker = SqliteWaker;

    const WRITE_TRANSACTION: Option<&'static str> = Some("BEGIN IMMEDIATE");

    fn migrator() -> Migrator {
        migrator()
    }

    fn waker(_db: &oncely_sql::Db<Sqlite>) -> SqliteWaker {
        SqliteWaker::default()
    }

    fn now(clock: &Clock) -> Option<i64> {
        Some(super::rows::Moment::from_time(clock.now()))
    }

    async fn enqueued(
        waker: &SqliteWaker,
        _conn: &mut SqliteConnection,
        kind: &str,
    ) -> Result<(), OutboxError> {
        waker.0.wake_kinds(&[kind]);
        Ok(())
    }

    fn wake(waker: &SqliteWaker) {
        waker.0.wake_all();
    }

    fn wakeup(waker: &SqliteWaker, kinds: &[String]) -> Wakeup {
        waker.0.subscribe(kinds)
    }
}
