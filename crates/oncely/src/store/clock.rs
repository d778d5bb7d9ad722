//! Where a key store reads the time: leases, retention and pruning all compare with it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

/// The time a key store works with.
///
/// [`Clock::Real`] (the default) is the real time: PostgreSQL's `now()`, so that many API
/// processes on many machines agree on when a lease or a retention period ends; this process's
/// clock on SQLite, where one machine owns the file. A [`ManualClock`] stands still until it is
/// advanced, so that a test can let a lease or a retention period pass without waiting for it:
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use oncely::store::{Clock, ManualClock};
///
/// let clock = ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
/// let store_clock = Clock::from(clock.clone()); // give this one to the store (`with_clock`)
/// clock.advance(Duration::from_secs(31)); // a 30 s lease has now passed for the store
/// assert_eq!(store_clock.now(), clock.now());
/// ```
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The real time (the database's on PostgreSQL).
    #[default]
    Real,
    /// A time that moves only when told to.
    Manual(ManualClock),
}

impl Clock {
    /// The injected time, or `None` for the real one (which PostgreSQL then reads itself).
    pub fn injected(&self) -> Option<SystemTime> {
        match self {
            Self::Real => None,
            Self::Manual(clock) => Some(clock.now()),
        }
    }

    /// The time now: the injected time, or this process's clock.
    pub fn now(&self) -> SystemTime {
        self.injected().unwrap_or_else(SystemTime::now)
    }
}

impl From<ManualClock> for Clock {
    fn from(clock: ManualClock) -> Self {
        Self::Manual(clock)
    }
}

/// A clock that stands still until [`advance`](Self::advance)d; its clones share the time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<SystemTime>>);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: SystemTime) -> Self {
        Self(Arc::new(Mutex::new(start)))
    }

    /// A clock standing at this moment of the real time.
    pub fn starting_now() -> Self {
        Self::new(SystemTime::now())
    }

    /// Moves the time forward by `by`.
    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }

    /// The time it stands at.
    pub fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
