//! The outbox on PostgreSQL: [`PgJobStore`], and how its workers learn of new jobs.
//!
//! An uncommitted job is invisible to other connections, so a wake-up must arrive at commit.
//! `pg_notify` inside the enqueuing transaction is delivered exactly then (and never on
//! rollback), but every transaction that notifies takes a cluster-wide lock at commit: one per
//! enqueue would serialise every committing enqueuer behind it. So the store rate-limits it:
//!
//! - an enqueue notifies inside its transaction when no enqueue of this store did within the
//!   last [`PgJobStore::notify_window`] ([`NOTIFY_WINDOW`], 5 ms): at most one notifying commit
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
//!
//! A NOTIFY names the kinds of its jobs (its payload is a JSON array of them; an empty payload,
//! as [`JobStore::wake`](super::JobStore::wake) sends, means every kind), so that a worker is
//! woken only for the kinds it runs.
//!
//! **Listening**: one listener per store (and its clones), on a connection of its own — not one
//! of the pool's, which the API and the claims need ([`LISTENER_APPLICATION_NAME`] in
//! `pg_stat_activity`). The first worker that asks for a wake-up starts it; it reads every
//! NOTIFY as it arrives, whatever the workers are doing (an unread listener would pin
//! PostgreSQL's notification queue, and a full queue fails every notifying commit), and fans
//! them out to the workers of the kinds they name: any number while a worker is busy are one
//! wake-up. If it cannot connect, or its connection breaks, it logs, retries with backoff
//! ([`LISTEN_RETRY_FIRST`] doubling to [`LISTEN_RETRY_MAX`]) and the workers poll meanwhile;
//! once it listens again it wakes every worker (what was announced in between is lost). The
//! gauge `oncely_outbox_listening` is 1 while it listens. It ends when the last clone of the
//! store goes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use oncely_sql::{Db, Pooling};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Postgres};
use time::OffsetDateTime;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::sql::NOTIFY;
use super::wakeups::{Hub, payload};
use super::{CHANNEL, Clock, Dialect, OutboxError, SqlJobStore, Wakeup};

pub use super::MIGRATIONS_TABLE;

/// A job store on PostgreSQL.
pub type PgJobStore = SqlJobStore<Postgres>;

/// The outbox's migrations (in [`MIGRATIONS_TABLE`]).
pub fn migrator() -> Migrator {
    super::migrator(sqlx::migrate!("migrations/postgres"))
}

/// At most one enqueue per this window notifies inside its transaction (see the module docs).
pub const NOTIFY_WINDOW: Duration = Duration::from_millis(5);

/// At most one NOTIFY from the background task per this interval, however many wakes.
pub const NOTIFY_INTERVAL: Duration = Duration::from_millis(5);

/// The `application_name` of the listener's connection.
pub const LISTENER_APPLICATION_NAME: &str = "oncely-outbox-listener";

/// The listener's first pause before it tries to connect again.
pub const LISTEN_RETRY_FIRST: Duration = Duration::from_millis(250);

/// The listener's longest pause before it tries to connect again.
pub const LISTEN_RETRY_MAX: Duration = Duration::from_secs(30);

/// How long one attempt of the listener to connect may take (a refused connection is retried
/// within it) before it counts as failed.
pub const LISTEN_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl PgJobStore {
    /// Workers only poll: for connection poolers in transaction mode, where LISTEN does not
    /// work. (Enqueues still notify: harmless without listeners.) A store on a [`Db`] of
    /// [`Pooling::Transaction`] polls unless [`listen_at`](Self::listen_at) names a server to
    /// listen on. Configure before cloning.
    pub fn poll_only(mut self) -> Self {
        self.waker = Arc::new(PgWaker {
            poll_only: true,
            ..PgWaker::new(self.db(), self.waker.window)
        });
        self
    }

    /// The listener connects with `options` (e.g. straight to the server, when the pool goes
    /// through a pooler in transaction mode) instead of the pool's. Configure before cloning.
    pub fn listen_at(mut self, options: PgConnectOptions) -> Self {
        self.waker = Arc::new(PgWaker {
            poll_only: self.waker.poll_only,
            listen_at: Some(options),
            ..PgWaker::new(self.db(), self.waker.window)
        });
        self
    }

    /// At most one enqueue per `window` notifies inside its transaction; the others get the
    /// trailing NOTIFY one window later (default [`NOTIFY_WINDOW`]). Configure before cloning.
    pub fn notify_window(mut self, window: Duration) -> Self {
        self.waker = Arc::new(PgWaker {
            poll_only: self.waker.poll_only,
            listen_at: self.waker.listen_at.clone(),
            ..PgWaker::new(self.db(), window)
        });
        self
    }
}

/// How a [`PgJobStore`] wakes workers: the rate limit of in-transaction NOTIFYs, the background
/// task that sends trailing and requested ones (started by the first it needs), and the listener
/// that fans NOTIFYs out to this store's workers (started by the first worker). Both end when the
/// last clone of the store goes.
#[derive(Debug)]
pub struct PgWaker {
    db: Db<Postgres>,
    poll_only: bool,
    /// Where the listener connects (`None`: where the pool does).
    listen_at: Option<PgConnectOptions>,
    window: Duration,
    due: Arc<Mutex<Due>>,
    kick: OnceLock<mpsc::Sender<()>>,
    hub: Arc<Hub>,
    /// Stops the listener when the store goes.
    listening: OnceLock<DropGuard>,
}

/// The NOTIFYs the store owes.
#[derive(Debug, Default)]
struct Due {
    /// When an enqueue last notified inside its transaction.
    in_transaction: Option<Instant>,
    /// A NOTIFY for every kind as soon as the interval allows (a wake after a commit).
    soon: bool,
    /// A NOTIFY when the window of an enqueue that skipped its own ends.
    window_end: Option<Instant>,
    /// The kinds of the enqueues that skipped their NOTIFY since the last one at a window end.
    window_kinds: BTreeSet<String>,
    /// A NOTIFY a window after the last enqueue that skipped its own.
    trailing: Option<Instant>,
    /// The kinds of the enqueues that skipped their NOTIFY since the last trailing one.
    trailing_kinds: BTreeSet<String>,
}

impl Due {
    fn next(&self) -> Option<Instant> {
        let soon = self.soon.then(Instant::now);
        [soon, self.window_end, self.trailing]
            .into_iter()
            .flatten()
            .min()
    }

    /// The payload of the NOTIFY sent at `at`, for everything due by then (which it clears).
    fn take(&mut self, at: Instant) -> String {
        let mut kinds = BTreeSet::new();
        if self.window_end.is_some_and(|end| end <= at) {
            self.window_end = None;
            kinds.append(&mut self.window_kinds);
        }
        if self.trailing.is_some_and(|trailing| trailing <= at) {
            self.trailing = None;
            kinds.append(&mut self.trailing_kinds);
        }
        if std::mem::take(&mut self.soon) {
            return String::new();
        }
        payload(kinds.iter().map(String::as_str))
    }

    /// An enqueue of `kind` at `now`: `true` if it notifies inside its transaction (no enqueue
    /// did within `window`); otherwise it arms the trailing NOTIFYs for its kind.
    fn enqueued(&mut self, now: Instant, window: Duration, kind: &str) -> bool {
        let window_end = match self.in_transaction {
            Some(last) if now < last + window => last + window,
            _ => {
                self.in_transaction = Some(now);
                return true;
            }
        };
        self.window_end = Some(window_end);
        self.window_kinds.insert(kind.to_owned());
        let at = now + window;
        self.trailing = Some(self.trailing.map_or(at, |trailing| trailing.max(at)));
        self.trailing_kinds.insert(kind.to_owned());
        false
    }
}

impl PgWaker {
    fn new(db: &Db<Postgres>, window: Duration) -> Self {
        Self {
            db: db.clone(),
            poll_only: false,
            listen_at: None,
            window,
            due: Arc::default(),
            kick: OnceLock::new(),
            hub: Arc::default(),
            listening: OnceLock::new(),
        }
    }

    fn due(&self) -> std::sync::MutexGuard<'_, Due> {
        self.due
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether this enqueue of `kind` notifies inside its transaction; if not, the trailing
    /// NOTIFYs are armed.
    fn notify_in_transaction(&self, kind: &str) -> bool {
        let here = self.due().enqueued(Instant::now(), self.window, kind);
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
                runtime.spawn(notifier(self.db.clone(), self.due.clone(), kicks));
            }
            kick
        });
        // Full: the task has a kick to read, and it reads `due` afresh.
        let _ = kick.try_send(());
    }

    /// Starts the listener, once. Outside a Tokio runtime it does nothing: workers poll.
    fn listen(&self) {
        self.listening.get_or_init(|| {
            let stop = CancellationToken::new();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let at = Listen {
                    pool: self.db.pool().clone(),
                    at: self.listen_at.clone(),
                };
                runtime.spawn(listener(at, self.hub.clone(), stop.clone()));
            }
            stop.drop_guard()
        });
    }
}

/// Sends the NOTIFYs that come due, at most one per [`NOTIFY_INTERVAL`], on the pool. When the
/// store is gone (no more kicks can come) it sends what it still owes, then ends.
async fn notifier(db: Db<Postgres>, due: Arc<Mutex<Due>>, mut kicks: mpsc::Receiver<()>) {
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
                let payload = due
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take(Instant::now());
                notify(&db, &payload).await;
                tokio::time::sleep(NOTIFY_INTERVAL).await;
            }
        }
    }
}

async fn notify(db: &Db<Postgres>, payload: &str) {
    if let Err(error) = sqlx::query(NOTIFY)
        .bind(CHANNEL)
        .bind(payload)
        .execute(db)
        .await
    {
        tracing::warn!(%error, "outbox NOTIFY failed; workers poll until it works again");
    }
}

/// Where the listener connects: `at`, or where the pool does (read at each attempt: a pool
/// that follows a primary may have moved).
struct Listen {
    pool: PgPool,
    at: Option<PgConnectOptions>,
}

/// Listens on [`CHANNEL`] on a connection of its own (`at`, as [`LISTENER_APPLICATION_NAME`]) and wakes the workers of the kinds each NOTIFY names, until
/// `stop`. Reconnects with backoff; wakes every worker whenever it (re)starts listening.
async fn listener(at: Listen, hub: Arc<Hub>, stop: CancellationToken) {
    let mut retry_in = LISTEN_RETRY_FIRST;
    loop {
        let options = match &at.at {
            Some(options) => options.clone(),
            None => (*at.pool.connect_options()).clone(),
        }
        .application_name(LISTENER_APPLICATION_NAME);
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            connected = connect_listener(options) => connected,
        };
        match connected {
            Ok(mut listener) => {
                tracing::info!("outbox listener listening");
                metrics::gauge!("oncely_outbox_listening").set(1.0);
                retry_in = LISTEN_RETRY_FIRST;
                // Jobs announced while nobody listened.
                hub.wake_all();
                let error = loop {
                    let received = tokio::select! {
                        () = stop.cancelled() => {
                            metrics::gauge!("oncely_outbox_listening").set(0.0);
                            return;
                        }
                        received = listener.try_recv() => received,
                    };
                    match received {
                        Ok(Some(notification)) => hub.wake_payload(notification.payload()),
                        // The connection broke and the listener connected again: what was
                        // announced in between is lost.
                        Ok(None) => {
                            tracing::warn!("outbox listener reconnected; waking every worker");
                            hub.wake_all();
                        }
                        Err(error) => break error,
                    }
                };
                metrics::gauge!("oncely_outbox_listening").set(0.0);
                tracing::warn!(%error, retry_in = ?retry_in, "outbox listener failed; workers poll until it listens again");
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?retry_in, "outbox listener cannot connect; workers poll until it listens");
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(retry_in) => {}
        }
        retry_in = (retry_in * 2).min(LISTEN_RETRY_MAX);
    }
}

/// A listener on a pool of one connection of its own, listening on [`CHANNEL`].
async fn connect_listener(options: PgConnectOptions) -> Result<PgListener, sqlx::Error> {
    let own = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(LISTEN_CONNECT_TIMEOUT)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(options);
    let mut listener = PgListener::connect_with(&own).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

impl Dialect for Postgres {
    type Moment = OffsetDateTime;
    type Waker = PgWaker;

    const WRITE_TRANSACTION: Option<&'static str> = None;

    fn migrator() -> Migrator {
        migrator()
    }

    fn waker(db: &Db<Postgres>) -> PgWaker {
        PgWaker::new(db, NOTIFY_WINDOW)
    }

    fn now(clock: &Clock) -> Option<OffsetDateTime> {
        clock.manual_now()
    }

    async fn enqueued(
        waker: &PgWaker,
        conn: &mut PgConnection,
        kind: &str,
    ) -> Result<(), OutboxError> {
        if waker.notify_in_transaction(kind) {
            sqlx::query(NOTIFY)
                .bind(CHANNEL)
                .bind(payload([kind]))
                .execute(conn)
                .await?;
        }
        Ok(())
    }

    fn wake(waker: &PgWaker) {
        waker.due().soon = true;
        waker.kick();
    }

    fn wakeup(waker: &PgWaker, kinds: &[String]) -> Wakeup {
        // Behind a transaction-mode pooler a LISTEN would hear nothing: poll, unless the
        // listener has a server of its own.
        if waker.poll_only
            || (waker.db.pooling() == Pooling::Transaction && waker.listen_at.is_none())
        {
            return Wakeup::poll();
        }
        let wakeup = waker.hub.subscribe(kinds);
        waker.listen();
        wakeup
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
            due.enqueued(ms(0), WINDOW, "a"),
            "the first notifies at its commit"
        );
        assert_eq!(due.next(), None);
        assert!(!due.enqueued(ms(10), WINDOW, "b"));
        assert!(!due.enqueued(ms(20), WINDOW, "c"));
        assert_eq!(due.window_end, Some(ms(25)), "when the window ends");
        assert_eq!(
            due.trailing,
            Some(ms(45)),
            "a window after the last that skipped"
        );
        assert_eq!(due.next(), Some(ms(25)));
        assert_eq!(due.take(ms(25)), r#"["b","c"]"#, "the kinds that skipped");
        assert_eq!(due.next(), Some(ms(45)));
        assert!(due.enqueued(ms(30), WINDOW, "a"), "a new window");
        assert_eq!(due.take(ms(45)), r#"["b","c"]"#);
        assert!(!due.enqueued(ms(50), WINDOW, "d"));
        assert_eq!(due.next(), Some(ms(55)));
        assert_eq!(due.take(ms(55)), r#"["d"]"#, "its window's end");
        assert_eq!(due.take(ms(75)), r#"["d"]"#, "a window after it");
        assert_eq!(due.next(), None);
    }

    #[test]
    fn a_wake_is_due_at_once_for_every_kind_and_leaves_later_trailing_notifies_armed() {
        let t0 = Instant::now();
        let mut due = Due::default();
        assert!(due.enqueued(t0, WINDOW, "a"));
        assert!(!due.enqueued(t0 + Duration::from_millis(5), WINDOW, "b"));
        due.soon = true;
        assert!(due.next().is_some_and(|at| at < t0 + WINDOW));
        assert_eq!(due.take(t0 + Duration::from_millis(6)), "", "every kind");
        assert!(!due.soon);
        assert_eq!(due.next(), Some(t0 + WINDOW));
        assert_eq!(due.take(t0 + WINDOW), r#"["b"]"#);
    }
}
