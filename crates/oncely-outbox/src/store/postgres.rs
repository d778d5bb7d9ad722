//! The outbox on PostgreSQL: [`PgJobStore`], and how its workers learn of new jobs.
//!
//! An uncommitted job is invisible to other connections, so a wake-up must arrive at commit.
//! `pg_notify` inside the enqueuing transaction is delivered exactly then (and never on
//! rollback), but every transaction that notifies takes a cluster-wide lock at commit: one per
//! enqueue would serialise every committing enqueuer behind it. So the store rate-limits it:
//!
//! - an enqueue notifies inside its transaction when no enqueue of this store did within the
//!   last [`PgJobStore::notify_window`] ([`NOTIFY_WINDOW`], 25 ms): at most one notifying commit
//!   per window, however many commit;
//! - an enqueue inside the window skips it and arms trailing NOTIFYs instead, sent by a
//!   background task on a connection of its own (outside any transaction): one when the window
//!   ends (the claim it starts finds every job committed by then: most are), and one a window
//!   after the last enqueue that skipped (by then its transaction has normally committed, even
//!   a slower one).
//!
//! A job whose transaction commits later than a window after its enqueue, at the end of a burst,
//! is found at the workers' next poll ([`crate::WorkerConfig::poll_interval`]). Per window that
//! is at most one notifying commit and two NOTIFYs of the background task. Call
//! [`JobStore::wake`](super::JobStore::wake) after committing jobs inserted by other means, or
//! after a transaction you hold open for long: one coalesced NOTIFY from the background task,
//! at most one per [`NOTIFY_INTERVAL`].

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgListener;
use sqlx::{Connection, PgConnection, PgPool, Postgres};
use time::OffsetDateTime;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::sql::NOTIFY;
use super::{CHANNEL, Clock, Dialect, OutboxError, SqlJobStore, Wakeup};

pub use super::MIGRATIONS_TABLE;

/// A job store on PostgreSQL.
pub type PgJobStore = SqlJobStore<Postgres>;

/// The outbox's migrations (in [`MIGRATIONS_TABLE`]).
pub fn migrator() -> Migrator {
    super::migrator(sqlx::migrate!("migrations/postgres"))
}

/// At most one enqueue per this window notifies inside its transaction (see the module docs).
pub const NOTIFY_WINDOW: Duration = Duration::from_millis(25);

/// At most one NOTIFY from the background task per this interval, however many wakes.
pub const NOTIFY_INTERVAL: Duration = Duration::from_millis(10);

impl PgJobStore {
    /// Workers only poll: for connection poolers in transaction mode, where LISTEN does not
    /// work. (Enqueues still notify: harmless without listeners.) Configure before cloning.
    pub fn poll_only(mut self) -> Self {
        self.waker = Arc::new(PgWaker {
            poll_only: true,
            ..PgWaker::new(self.pool(), self.waker.window)
        });
        self
    }

    /// At most one enqueue per `window` notifies inside its transaction; the others get the
    /// trailing NOTIFY one window later (default [`NOTIFY_WINDOW`]). Configure before cloning.
    pub fn notify_window(mut self, window: Duration) -> Self {
        self.waker = Arc::new(PgWaker {
            poll_only: self.waker.poll_only,
            ..PgWaker::new(self.pool(), window)
        });
        self
    }
}

/// How a [`PgJobStore`] wakes workers: the rate limit of in-transaction NOTIFYs, and the
/// background task that sends trailing and requested ones (started by the first it needs; it
/// ends when the last clone of the store goes).
#[derive(Debug)]
pub struct PgWaker {
    pool: PgPool,
    poll_only: bool,
    window: Duration,
    due: Arc<Mutex<Due>>,
    kick: OnceLock<mpsc::Sender<()>>,
}

/// The NOTIFYs the store owes.
#[derive(Debug, Default)]
struct Due {
    /// When an enqueue last notified inside its transaction.
    in_transaction: Option<Instant>,
    /// A NOTIFY as soon as the interval allows (a wake after a commit).
    soon: bool,
    /// A NOTIFY when the window of an enqueue that skipped its own ends.
    window_end: Option<Instant>,
    /// A NOTIFY a window after the last enqueue that skipped its own.
    trailing: Option<Instant>,
}

impl Due {
    fn next(&self) -> Option<Instant> {
        let soon = self.soon.then(Instant::now);
        [soon, self.window_end, self.trailing]
            .into_iter()
            .flatten()
            .min()
    }

    fn sent(&mut self, at: Instant) {
        self.soon = false;
        self.window_end = self.window_end.filter(|end| *end > at);
        self.trailing = self.trailing.filter(|trailing| *trailing > at);
    }

    /// An enqueue at `now`: `true` if it notifies inside its transaction (no enqueue did within
    /// `window`); otherwise it arms the trailing NOTIFYs.
    fn enqueued(&mut self, now: Instant, window: Duration) -> bool {
        let window_end = match self.in_transaction {
            Some(last) if now < last + window => last + window,
            _ => {
                self.in_transaction = Some(now);
                return true;
            }
        };
        self.window_end = Some(window_end);
        let at = now + window;
        self.trailing = Some(self.trailing.map_or(at, |trailing| trailing.max(at)));
        false
    }
}

impl PgWaker {
    fn new(pool: &PgPool, window: Duration) -> Self {
        Self {
            pool: pool.clone(),
            poll_only: false,
            window,
            due: Arc::default(),
            kick: OnceLock::new(),
        }
    }

    fn due(&self) -> std::sync::MutexGuard<'_, Due> {
        self.due
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether this enqueue notifies inside its transaction; if not, the trailing NOTIFYs are
    /// armed.
    fn notify_in_transaction(&self) -> bool {
        let here = self.due().enqueued(Instant::now(), self.window);
        if !here {
            self.kick();
        }
        here
    }

    /// Tells the background task to look at what is due (starting it first). Outside a Tokio
    /// runtime it does nothing: workers poll.
    fn kick(&self) {
        let kick = self.kick.get_or_init(|| {
            let (kick, kicks) = mpsc::channel(1);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(notifier(self.pool.clone(), self.due.clone(), kicks));
            }
            kick
        });
        // Full: the task has a kick to read, and it reads `due` afresh.
        let _ = kick.try_send(());
    }
}

/// Sends the NOTIFYs that come due, on a connection of its own, at most one per
/// [`NOTIFY_INTERVAL`]. When the store is gone (no more kicks can come) it sends what it still
/// owes, then ends.
async fn notifier(pool: PgPool, due: Arc<Mutex<Due>>, mut kicks: mpsc::Receiver<()>) {
    let mut conn: Option<PgConnection> = None;
    let mut store_gone = false;
    loop {
        let next = due.lock().unwrap_or_else(|p| p.into_inner()).next();
        match next {
            None if store_gone => return,
            None => store_gone = kicks.recv().await.is_none(),
            Some(at) if at > Instant::now() => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    kick = kicks.recv(), if !store_gone => store_gone = kick.is_none(),
                }
            }
            Some(_) => {
                due.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .sent(Instant::now());
                notify(&pool, &mut conn).await;
                tokio::time::sleep(NOTIFY_INTERVAL).await;
            }
        }
    }
}

async fn notify(pool: &PgPool, conn: &mut Option<PgConnection>) {
    if conn.is_none() {
        match PgConnection::connect_with(&pool.connect_options()).await {
            Ok(c) => *conn = Some(c),
            Err(error) => tracing::warn!(%error, "outbox notifier cannot connect; workers poll"),
        }
    }
    if let Some(c) = conn.as_mut()
        && let Err(error) = sqlx::query(NOTIFY).bind(CHANNEL).execute(&mut *c).await
    {
        tracing::warn!(%error, "outbox NOTIFY failed; workers poll until it works again");
        *conn = None;
    }
}

impl Dialect for Postgres {
    type Moment = OffsetDateTime;
    type Waker = PgWaker;

    const WRITE_TRANSACTION: Option<&'static str> = None;

    fn migrator() -> Migrator {
        migrator()
    }

    fn waker(pool: &PgPool) -> PgWaker {
        PgWaker::new(pool, NOTIFY_WINDOW)
    }

    fn now(clock: &Clock) -> Option<OffsetDateTime> {
        clock.manual_now()
    }

    async fn enqueued(waker: &PgWaker, conn: &mut PgConnection) -> Result<(), OutboxError> {
        if waker.notify_in_transaction() {
            sqlx::query(NOTIFY).bind(CHANNEL).execute(conn).await?;
        }
        Ok(())
    }

    fn wake(waker: &PgWaker) {
        waker.due().soon = true;
        waker.kick();
    }

    async fn wakeup(waker: &PgWaker, pool: &PgPool) -> Result<Wakeup, OutboxError> {
        if waker.poll_only {
            return Ok(Wakeup::Poll);
        }
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(CHANNEL).await?;
        Ok(Wakeup::Listen(Box::new(listener)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_millis(25);

    #[test]
    fn one_enqueue_per_window_notifies_in_its_transaction_the_others_arm_two_trailing_notifies() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut due = Due::default();
        assert!(
            due.enqueued(ms(0), WINDOW),
            "the first notifies at its commit"
        );
        assert_eq!(due.next(), None);
        assert!(!due.enqueued(ms(10), WINDOW));
        assert!(!due.enqueued(ms(20), WINDOW));
        assert_eq!(due.window_end, Some(ms(25)), "when the window ends");
        assert_eq!(
            due.trailing,
            Some(ms(45)),
            "a window after the last that skipped"
        );
        assert_eq!(due.next(), Some(ms(25)));
        due.sent(ms(25));
        assert_eq!(due.next(), Some(ms(45)));
        assert!(due.enqueued(ms(30), WINDOW), "a new window");
        due.sent(ms(45));
        assert_eq!(due.next(), None);
    }

    #[test]
    fn a_wake_is_due_at_once_and_leaves_later_trailing_notifies_armed() {
        let t0 = Instant::now();
        let mut due = Due::default();
        assert!(due.enqueued(t0, WINDOW));
        assert!(!due.enqueued(t0 + Duration::from_millis(5), WINDOW));
        due.soon = true;
        assert!(due.next().is_some_and(|at| at < t0 + WINDOW));
        due.sent(t0 + Duration::from_millis(6));
        assert!(!due.soon);
        assert_eq!(due.next(), Some(t0 + WINDOW));
    }
}
