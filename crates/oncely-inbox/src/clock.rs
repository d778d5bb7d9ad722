//! The inbox's time: the system clock, or a manual one that tests move (retention by age, the
//! provider-mode window, fault periods) instead of sleeping.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use time::OffsetDateTime;

/// Where the inbox reads the time. Cheap to clone; clones of a manual clock share its time.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    manual: Option<Arc<Mutex<OffsetDateTime>>>,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Self::default()
    }

    /// A clock that stands at `start` until [`Clock::advance`] moves it.
    pub fn manual(start: OffsetDateTime) -> Self {
        Self {
            manual: Some(Arc::new(Mutex::new(start))),
        }
    }

    /// The time now.
    pub fn now(&self) -> OffsetDateTime {
        match &self.manual {
            Some(at) => *at.lock().unwrap_or_else(|poisoned| poisoned.into_inner()),
            None => OffsetDateTime::now_utc(),
        }
    }

    /// Moves a manual clock forward by `by` (no effect on the system clock).
    pub fn advance(&self, by: Duration) {
        if let Some(at) = &self.manual {
            let mut at = at.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            *at += by;
        }
    }
}
