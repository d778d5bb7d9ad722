//! The outbox on SQLite, the embedded default: [`SqliteJobStore`].
//!
//! Workers run in the process that owns the file, so an enqueue wakes them with an in-process
//! signal, sent at once — inside the enqueuing transaction. That is safe because SQLite has one
//! writer: the transaction holds the write lock from its first write until it ends, and a
//! worker's claim begins with `BEGIN IMMEDIATE`, so a woken worker's claim waits for the commit
//! and then finds the job (after a rollback it finds nothing: a harmless empty claim). A library
//! user gets prompt pickup without knowing about it.

use sqlx::migrate::Migrator;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::watch;

use super::{Clock, Dialect, OutboxError, SqlJobStore, Wakeup};

pub use super::MIGRATIONS_TABLE;

/// A job store on SQLite.
pub type SqliteJobStore = SqlJobStore<Sqlite>;

/// The outbox's migrations (in [`MIGRATIONS_TABLE`]).
pub fn migrator() -> Migrator {
    super::migrator(sqlx::migrate!("migrations/sqlite"))
}

/// How a [`SqliteJobStore`] wakes its process's workers: a counter each enqueue and wake bumps.
/// A worker that was busy claiming when it moved sees the change at its next wait.
#[derive(Debug)]
pub struct SqliteWaker(watch::Sender<u64>);

impl SqliteWaker {
    fn signal(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl Dialect for Sqlite {
    /// Unix milliseconds.
    type Moment = i64;
    type Waker = SqliteWaker;

    const WRITE_TRANSACTION: Option<&'static str> = Some("BEGIN IMMEDIATE");

    fn migrator() -> Migrator {
        migrator()
    }

    fn waker(_pool: &SqlitePool) -> SqliteWaker {
        SqliteWaker(watch::Sender::new(0))
    }

    fn now(clock: &Clock) -> Option<i64> {
        Some(super::rows::Moment::from_time(clock.now()))
    }

    async fn enqueued(
        waker: &SqliteWaker,
        _conn: &mut SqliteConnection,
    ) -> Result<(), OutboxError> {
        waker.signal();
        Ok(())
    }

    fn wake(waker: &SqliteWaker) {
        waker.signal();
    }

    async fn wakeup(waker: &SqliteWaker, _pool: &SqlitePool) -> Result<Wakeup, OutboxError> {
        Ok(Wakeup::Signal(waker.0.subscribe()))
    }
}
