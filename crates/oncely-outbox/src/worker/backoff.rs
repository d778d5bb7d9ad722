//! Asking again after a failure that may pass (a database blip, a connection the server
//! ended): waits that double from 50 ms to 2 s, never past a deadline.

use std::time::Duration;

use tokio::time::Instant;

/// First and longest wait.
const FIRST: Duration = Duration::from_millis(50);
const MAX: Duration = Duration::from_secs(2);

/// The waits before each new try, until `deadline`.
pub(super) struct Backoff {
    next: Duration,
    deadline: Instant,
}

impl Backoff {
    pub(super) fn until(deadline: Instant) -> Self {
        Self {
            next: FIRST,
            deadline,
        }
    }

    /// The wait before the next try, or `None` if that try would start past the deadline.
    /// Counts the wait as taken.
    pub(super) fn next(&mut self) -> Option<Duration> {
        self.next_at(Instant::now())
    }

    fn next_at(&mut self, now: Instant) -> Option<Duration> {
        let wait = self.next;
        if now + wait >= self.deadline {
            return None;
        }
        self.next = (wait * 2).min(MAX);
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waits_double_up_to_two_seconds_and_stop_before_the_deadline() {
        let mut now = Instant::now();
        let mut backoff = Backoff::until(now + Duration::from_secs(5));
        let mut waits = Vec::new();
        while let Some(wait) = backoff.next_at(now) {
            waits.push(wait.as_millis());
            now += wait;
        }
        // 50+100+200+400+800+1600 = 3150 ms; the next (2000) would end past 5 s.
        assert_eq!(waits, [50, 100, 200, 400, 800, 1600]);
    }
}
