//! The retry policy: a value, with a const default, and the decision it makes about an
//! attempt's outcome (retry when, or give up).

use std::time::Duration;

use time::OffsetDateTime;

use crate::job::{AttemptResult, Delivery, Job};
use crate::store::Finish;

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

    /// What to record of `job`'s attempt that reported `delivery`, at `now`: sent; dead at once
    /// (permanent, skipped); or, for a retry or an unknown outcome, due again after
    /// [`RetryPolicy::delay`] — unless that was the last attempt, or the next try would fall
    /// after the horizon: then dead, keeping the attempt's result.
    pub fn decide(&self, job: &Job, delivery: Delivery, now: OffsetDateTime) -> Finish {
        let (result, error) = match delivery {
            Delivery::Sent {
                provider_message_id,
            } => return Finish::sent(provider_message_id),
            Delivery::Permanent(error) => return Finish::dead(AttemptResult::Dead, error),
            Delivery::Skipped(reason) => return Finish::dead(AttemptResult::Skipped, reason),
            Delivery::Retry(error) => (AttemptResult::Retry, error),
            Delivery::Unknown(error) => (AttemptResult::Unknown, error),
        };
        let retry_in = self.delay(job.attempt);
        let age = (now - job.created_at).try_into().unwrap_or(Duration::ZERO);
        if job.attempt >= self.max_attempts {
            let why = format!("gave up after {} attempts: {error}", job.attempt);
            return Finish::dead(result, why);
        }
        if age + retry_in > self.horizon {
            let why = format!(
                "gave up: the next try would fall after the {:?} retry horizon: {error}",
                self.horizon
            );
            return Finish::dead(result, why);
        }
        Finish::retry(result, retry_in, error)
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
    use crate::job::JobStatus;

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

    fn job(attempt: i32, age: Duration) -> Job {
        let now = OffsetDateTime::now_utc();
        Job {
            id: 1,
            operation_key: "k".into(),
            kind: "email".into(),
            payload: serde_json::Value::Null,
            delivery_key: uuid::Uuid::nil(),
            attempt,
            created_at: now - age,
            not_after: None,
            lease_token: uuid::Uuid::nil(),
            frozen: None,
        }
    }

    #[test]
    fn a_failed_attempt_is_retried_within_the_budget_then_dead_with_its_result() {
        let p = RetryPolicy::DEFAULT;
        let now = OffsetDateTime::now_utc();
        let retry = p.decide(
            &job(1, Duration::ZERO),
            Delivery::Unknown("timeout".into()),
            now,
        );
        assert_eq!(retry.status, JobStatus::Pending);
        assert_eq!(retry.result, AttemptResult::Unknown);
        assert!(retry.retry_in >= p.base / 2 && retry.retry_in <= p.base);
        let last = p.decide(&job(12, Duration::ZERO), Delivery::Retry("451".into()), now);
        assert_eq!(
            (last.status, last.result),
            (JobStatus::Dead, AttemptResult::Retry)
        );
        assert_eq!(
            last.error.as_deref(),
            Some("gave up after 12 attempts: 451")
        );
        let late = p.decide(&job(2, p.horizon), Delivery::Retry("451".into()), now);
        assert_eq!(late.status, JobStatus::Dead);
        assert!(late.error.unwrap().contains("retry horizon: 451"));
    }

    #[test]
    fn sent_permanent_and_skipped_are_final() {
        let p = RetryPolicy::DEFAULT;
        let now = OffsetDateTime::now_utc();
        let decide = |d| p.decide(&job(1, Duration::ZERO), d, now);
        let sent = decide(Delivery::Sent {
            provider_message_id: Some("p".into()),
        });
        assert_eq!(sent, Finish::sent(Some("p".into())));
        let dead = decide(Delivery::Permanent("550".into()));
        assert_eq!(dead, Finish::dead(AttemptResult::Dead, "550".into()));
        let skipped = decide(Delivery::Skipped("no recipient".into()));
        assert_eq!(skipped.result, AttemptResult::Skipped);
        assert_eq!(skipped.status, JobStatus::Dead);
    }

    #[test]
    fn jitter_spreads_retries() {
        let p = RetryPolicy::DEFAULT;
        let delays: std::collections::HashSet<_> = (0..20).map(|_| p.delay(5)).collect();
        assert!(delays.len() > 10);
    }
}
