//! The retry policy: a value, with a const default.

use std::time::Duration;

/// When to try again, and when to give up.
///
/// The delay before attempt `n + 1` is `base * 2^(n-1)`, capped at `max_delay`, with equal
/// jitter (a random point in its upper half), so that many jobs failing together do not retry
/// together. A job is dead after `max_attempts`, or when its next try would fall after
/// `horizon` from its creation: keep the horizon inside the provider's idempotency window
/// (24 h for common email APIs), so that a retry is still deduplicated.
///
/// ```
/// use oncely_outbox::RetryPolicy;
/// let policy = RetryPolicy::DEFAULT;
/// assert!(policy.delay(1) <= std::time::Duration::from_secs(2));
/// assert!(policy.delay(30) <= policy.max_delay);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first delay.
    pub base: Duration,
    /// The longest delay.
    pub max_delay: Duration,
    /// Give up after this many attempts.
    pub max_attempts: i32,
    /// Give up when the next try would fall after this long since the job was created.
    pub horizon: Duration,
}

impl RetryPolicy {
    /// 2 s doubling to 10 min, 12 attempts, a 23 h horizon.
    pub const DEFAULT: Self = Self {
        base: Duration::from_secs(2),
        max_delay: Duration::from_secs(600),
        max_attempts: 12,
        horizon: Duration::from_secs(23 * 3600),
    };

    /// The delay after attempt `attempt` (from 1) failed, jitter included.
    pub fn delay(&self, attempt: i32) -> Duration {
        let exponent = u32::try_from(attempt.saturating_sub(1))
            .unwrap_or(0)
            .min(30);
        let full = self.base.saturating_mul(1 << exponent).min(self.max_delay);
        let half = full / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_exponentially_within_their_jitter_band() {
        let p = RetryPolicy {
            base: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
            ..RetryPolicy::DEFAULT
        };
        for attempt in 1..=10 {
            let full = Duration::from_secs(1 << (attempt - 1)).min(Duration::from_secs(60));
            for _ in 0..50 {
                let d = p.delay(attempt);
                assert!(
                    d >= full / 2 && d <= full,
                    "attempt {attempt}: {d:?} not in [{:?}, {full:?}]",
                    full / 2
                );
            }
        }
    }

    #[test]
    fn jitter_spreads_retries() {
        let p = RetryPolicy::DEFAULT;
        let delays: std::collections::HashSet<_> = (0..20).map(|_| p.delay(5)).collect();
        assert!(delays.len() > 10);
    }
}
