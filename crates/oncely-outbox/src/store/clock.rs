//! The outbox's "now", as a value a test can set.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use time::OffsetDateTime;

/// Where a store reads the time.
///
/// [`Clock::system`] (the default): PostgreSQL statements use the database's `now()` (one clock
/// for every process), SQLite statements and the worker the process clock. [`Clock::manual`]: a
/// time the caller sets and moves — every statement and the worker read it instead, so a test
/// lets a lease, a retry delay or a retention pass with [`Clock::advance`] instead of sleeping.
///
/// ```
/// use oncely_outbox::store::Clock;
/// let clock = Clock::manual(time::OffsetDateTime::UNIX_EPOCH);
/// clock.advance(std::time::Duration::from_secs(30));
/// assert_eq!(clock.now().unix_timestamp(), 30);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Clock(Option<Arc<Mutex<OffsetDateTime>>>);

impl Clock {
    /// The real time.
    pub fn system() -> Self {
        Self(None)
    }

    /// A time that stands at `start` until [`Clock::advance`] moves it. Clones share it.
    pub fn manual(start: OffsetDateTime) -> Self {
        Self(Some(Arc::new(Mutex::new(start))))
    }

    /// Moves a manual clock forward.
    ///
    /// # Panics
    /// On the system clock: time there passes by itself.
    pub fn advance(&self, by: Duration) {
        let manual = self
            .0
            .as_ref()
            .expect("only a manual clock can be advanced");
        let mut now = manual
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *now += by;
    }

    /// The time now.
    pub fn now(&self) -> OffsetDateTime {
        self.manual_now().unwrap_or_else(OffsetDateTime::now_utc)
    }

    /// The manual clock's time; `None` on the system clock.
    pub(crate) fn manual_now(&self) -> Option<OffsetDateTime> {
        self.0
            .as_ref()
            .map(|now| *now.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }
}
