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
/// together. After a failure (a plain retry, an unknown outcome) only the attempts that spent
/// the budget count in `n`, so that throttles or refusals earlier in a job's life do not stretch
/// the wait after its first real failure. A throttle waits the `Retry-After` the provider gave
/// (if longer than that backoff); one without a `Retry-After` counts every attempt in `n`, so a
/// provider that keeps throttling is asked less and less often.
///
/// Two limits end the retries; then the job is dead, with its reason:
/// - the **attempt budget**: `max_attempts` attempts that failed ([`Delivery::Retry`],
///   [`Delivery::Unknown`]). Throttled and paused attempts ([`Delivery::Throttled`],
///   [`Delivery::Refused`]) spend none of it: a provider's rate limit or a wrong API key says
///   nothing about the job.
/// - the **horizon**: the next try would fall more than `horizon` after the job was enqueued or
///   last re-driven ([`Job::horizon_from`]). Keep it inside the provider's idempotency window
///   (24 h for common email APIs), so that a retry is still deduplicated. It applies to every
///   outcome that is retried, throttled and paused ones included.
///
/// A throttled attempt waits the later of the backoff and the `Retry-After` the provider sent;
/// a `Retry-After` longer than `max_delay` is cut to `max_delay` (the job asks again then, which
/// costs nothing but one request) rather than trusted blindly. A paused attempt is due again at
/// once: the worker's breaker for its kind decides when it runs (one probe per
/// [`KindOptions::probe_interval`](crate::KindOptions::probe_interval)).
///
/// The default budget reaches the horizon: even if every delay fell on the shortest point of
/// its jitter, the job would hit the 23 h horizon before its 60th attempt (56 attempts fit),
/// so a provider outage of hours does not kill an email before the horizon does.
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
    /// The longest delay (and the longest `Retry-After` honoured).
    pub max_delay: Duration,
    /// Give up after this many failed attempts (throttled and paused ones do not count).
    pub max_attempts: i32,
    /// Give up when the next try would fall after this long since the job was enqueued or last
    /// re-driven.
    pub horizon: Duration,
}

impl RetryPolicy {
    /// 2 s doubling to 1 h, 60 attempts, a 23 h horizon: the horizon, not the budget, ends a
    /// job that keeps failing (see the type's docs).
    pub const DEFAULT: Self = Self {
        base: Duration::from_secs(2),
        max_delay: Duration::from_secs(3600),
        max_attempts: 60,
        horizon: Duration::from_secs(23 * 3600),
    };

    /// The delay after attempt `attempt` (from 1) failed, jitter included: a random point in
    /// the upper half of the full delay.
    pub fn delay(&self, attempt: i32) -> Duration {
        let half = self.full_delay(attempt) / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    /// The delay after `attempt` before jitter: `base * 2^(attempt-1)`, capped at `max_delay`.
    fn full_delay(&self, attempt: i32) -> Duration {
        let exponent = u32::try_from(attempt.saturating_sub(1))
            .unwrap_or(0)
            .min(30);
        self.base.saturating_mul(1 << exponent).min(self.max_delay)
    }

    /// What to record of `job`'s attempt that reported `delivery`, at `now`:
    /// - sent; dead at once (permanent); skipped (the handler chose not to run it);
    /// - a retry or an unknown outcome: due again after [`RetryPolicy::delay`], spending an
    ///   attempt — unless that was the last attempt of the budget;
    /// - throttled: due again after the later of the delay and its `after` (cut to
    ///   `max_delay`), spending no attempt;
    /// - refused (paused): due again at once, spending no attempt (the worker's breaker holds
    ///   the kind);
    ///
    /// and in every retried case dead, keeping the attempt's result, if the next try would fall
    /// after the horizon.
    pub fn decide(&self, job: &Job, delivery: Delivery, now: OffsetDateTime) -> Finish {
        // The attempts that failed so far, this one included (throttled and paused ones are not
        // failures).
        let failed = job.attempt - job.free_attempts;
        let (result, error, retry_in, free) = match delivery {
            Delivery::Sent {
                provider_message_id,
            } => return Finish::sent(provider_message_id),
            Delivery::Permanent(error) => return Finish::dead(AttemptResult::Dead, error),
            Delivery::Skipped(reason) => return Finish::skipped(reason),
            Delivery::Retry(error) => (AttemptResult::Retry, error, self.delay(failed), false),
            Delivery::Unknown(error) => (AttemptResult::Unknown, error, self.delay(failed), false),
            Delivery::Throttled { reason, after } => {
                // The provider said when: that, or the failures' backoff if longer. It did not:
                // back off over every attempt, so a provider that keeps throttling is asked less
                // and less often.
                let retry_in = match after {
                    Some(after) => self.delay(failed).max(after.min(self.max_delay)),
                    None => self.delay(job.attempt),
                };
                (AttemptResult::Throttled, reason, retry_in, true)
            }
            Delivery::Refused(reason) => (AttemptResult::Paused, reason, Duration::ZERO, true),
        };
        // The budget spent, this attempt included if it counts.
        let spent = job.attempt - job.free_attempts - i32::from(free);
        if !free && spent >= self.max_attempts {
            let why = match job.free_attempts {
                0 => format!("gave up after {spent} attempts: {error}"),
                n => {
                    format!("gave up after {spent} attempts (and {n} throttled or paused): {error}")
                }
            };
            return Finish::dead(result, why);
        }
        let age = (now - job.horizon_from())
            .try_into()
            .unwrap_or(Duration::ZERO);
        if age + retry_in > self.horizon {
            let why = format!(
                "gave up: the next try would fall after the {:?} retry horizon: {error}",
                self.horizon
            );
            return Finish::dead(result, why);
        }
        if free {
            Finish::retry_free(result, retry_in, error)
        } else {
            Finish::retry(result, retry_in, error)
        }
    }
}

/// What a worker does with a job whose attempt may or may not have reached the provider: an
/// unknown outcome ([`Delivery::Unknown`]: a timeout after the message was handed over, a broken
/// connection, a handler that ran past its time) or an attempt its worker abandoned (it died or
/// lost its lease mid-send).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnUnknown {
    /// Send again under the same delivery key, as the retry policy says: right for transports
    /// that deduplicate by that key (an email API with `Idempotency-Key`), where a resend is at
    /// most one delivery. Over a transport that does not (plain SMTP), each such resend may be a
    /// duplicate.
    #[default]
    Resend,
    /// Park the job ([`JobStatus::Unknown`](crate::JobStatus)), its attempts kept, and send
    /// nothing more until it is settled ([`JobStore::settle`](crate::JobStore::settle)) by
    /// whoever can tell whether the provider accepted it: a reconciler asking the provider by
    /// delivery key, or an operator. A parked job is in no due index: it never holds up others.
    Reconcile,
}

impl OnUnknown {
    /// The name used in configuration: `resend`, `reconcile`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Resend => "resend",
            Self::Reconcile => "reconcile",
        }
    }

    /// The policy named `s` (`resend`, `reconcile`), if any.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Resend, Self::Reconcile]
            .into_iter()
            .find(|policy| policy.as_str() == s)
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

    /// Found by the chaos run of issue 14: a job throttled five times then refused once waited
    /// 64–128 s, as if it had failed seven times.
    #[test]
    fn throttles_do_not_stretch_the_wait_after_a_failure_but_stretch_the_next_throttle() {
        let p = RetryPolicy::DEFAULT;
        let now = OffsetDateTime::now_utc();
        let throttled_five_times = Job {
            free_attempts: 5,
            ..job(7, Duration::ZERO)
        };
        let retry = p.decide(&throttled_five_times, Delivery::Retry("503".into()), now);
        assert!(
            retry.retry_in >= p.full_delay(2) / 2 && retry.retry_in <= p.full_delay(2),
            "{:?}",
            retry.retry_in
        );
        let throttle = Delivery::Throttled {
            reason: "450".into(),
            after: None,
        };
        let throttled = p.decide(&throttled_five_times, throttle, now);
        assert!(
            throttled.retry_in >= p.full_delay(7) / 2,
            "{:?}",
            throttled.retry_in
        );
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
            free_attempts: 0,
            created_at: now - age,
            redriven_at: None,
            not_after: None,
            lease_token: uuid::Uuid::nil(),
            frozen: None,
            partition: None,
            settled_as_sent: false,
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
        let last = p.decide(
            &job(p.max_attempts, Duration::ZERO),
            Delivery::Retry("451".into()),
            now,
        );
        assert_eq!(
            (last.status, last.result),
            (JobStatus::Dead, AttemptResult::Retry)
        );
        assert_eq!(
            last.error.as_deref(),
            Some("gave up after 60 attempts: 451")
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
        // Issue 15, item 4: skipped is not dead (it was `Dead`, listed with real failures).
        let skipped = decide(Delivery::Skipped("no recipient".into()));
        assert_eq!(skipped.result, AttemptResult::Skipped);
        assert_eq!(skipped.status, JobStatus::Skipped);
        assert_eq!(skipped.error.as_deref(), Some("no recipient"));
    }

    #[test]
    fn jitter_spreads_retries() {
        let p = RetryPolicy::DEFAULT;
        let delays: std::collections::HashSet<_> = (0..20).map(|_| p.delay(5)).collect();
        assert!(delays.len() > 10);
    }

    /// Issue 14, item 1: the default policy gave up after 12 attempts, 19–37 minutes in, long
    /// before its 23 h horizon. Worst case: every delay on the shortest point of its jitter (the
    /// most attempts in the least time). Every attempt whose next try cannot cross the horizon
    /// must be retried, and the budget must outlast the horizon.
    #[test]
    fn the_default_budget_outlasts_the_horizon_even_with_the_shortest_jitter() {
        let p = RetryPolicy::DEFAULT;
        let now = OffsetDateTime::now_utc();
        let mut age = Duration::ZERO;
        let mut attempt = 1;
        // Attempts whose longest next delay still lands inside the horizon: retried for sure.
        while age + p.full_delay(attempt) <= p.horizon {
            let finish = p.decide(&job(attempt, age), Delivery::Retry("503".into()), now);
            assert_eq!(
                finish.status,
                JobStatus::Pending,
                "attempt {attempt}, {age:?} in: {:?}",
                finish.error
            );
            age += p.full_delay(attempt) / 2; // the shortest delay
            attempt += 1;
        }
        // And until even the shortest next delay crosses the horizon, the budget holds.
        while age + p.full_delay(attempt) / 2 <= p.horizon {
            attempt += 1;
            age += p.full_delay(attempt - 1) / 2;
        }
        assert!(
            attempt < p.max_attempts,
            "{attempt} attempts fit in the horizon, the budget is {}",
            p.max_attempts
        );
    }

    #[test]
    fn a_throttled_attempt_waits_for_retry_after_and_spends_no_attempt() {
        let p = RetryPolicy {
            max_attempts: 3,
            ..RetryPolicy::DEFAULT
        };
        let now = OffsetDateTime::now_utc();
        let throttled = |after| Delivery::Throttled {
            reason: "429".into(),
            after,
        };
        // The third attempt is the budget's last: a plain retry is dead, a throttle is not.
        let dead = p.decide(&job(3, Duration::ZERO), Delivery::Retry("503".into()), now);
        assert_eq!(dead.status, JobStatus::Dead);
        let after = Duration::from_secs(120);
        let waits = p.decide(&job(3, Duration::ZERO), throttled(Some(after)), now);
        assert_eq!(
            (waits.status, waits.result, waits.free_attempt),
            (JobStatus::Pending, AttemptResult::Throttled, true)
        );
        assert_eq!(waits.retry_in, after, "Retry-After beats the 4-8 s backoff");
        // Without Retry-After: the backoff, which grows with every attempt, throttled or not.
        let backoff = p.decide(&job(3, Duration::ZERO), throttled(None), now);
        assert!(backoff.retry_in >= p.base * 2 && backoff.retry_in <= p.base * 4);
        // Free attempts do not count: attempt 5 after two throttles has spent two.
        let mut after_throttles = job(5, Duration::ZERO);
        after_throttles.free_attempts = 2;
        let retried = p.decide(&after_throttles, Delivery::Retry("503".into()), now);
        assert_eq!(retried.status, JobStatus::Dead, "2 + this one = 3");
        after_throttles.free_attempts = 3;
        let retried = p.decide(&after_throttles, Delivery::Retry("503".into()), now);
        assert_eq!(retried.status, JobStatus::Pending, "1 + this one = 2");
        assert!(!retried.free_attempt);
    }

    #[test]
    fn an_absurd_retry_after_is_cut_to_the_longest_delay_and_the_horizon_still_applies() {
        let p = RetryPolicy::DEFAULT;
        let now = OffsetDateTime::now_utc();
        let year = Some(Duration::from_secs(365 * 24 * 3600));
        let throttled = Delivery::Throttled {
            reason: "429".into(),
            after: year,
        };
        let cut = p.decide(&job(1, Duration::ZERO), throttled.clone(), now);
        assert_eq!(cut.status, JobStatus::Pending);
        assert_eq!(cut.retry_in, p.max_delay);
        let late = p.decide(&job(4, p.horizon - p.max_delay / 2), throttled, now);
        assert_eq!(
            (late.status, late.result),
            (JobStatus::Dead, AttemptResult::Throttled)
        );
        assert!(late.error.unwrap().contains("retry horizon: 429"));
    }

    #[test]
    fn a_refusal_pauses_the_job_without_spending_an_attempt_until_the_horizon() {
        let p = RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::DEFAULT
        };
        let now = OffsetDateTime::now_utc();
        let refused = || Delivery::Refused("HTTP 401".into());
        let paused = p.decide(&job(1, Duration::ZERO), refused(), now);
        assert_eq!(
            paused,
            Finish::retry_free(AttemptResult::Paused, Duration::ZERO, "HTTP 401".into())
        );
        let late = p.decide(&job(7, p.horizon + Duration::from_secs(1)), refused(), now);
        assert_eq!(
            (late.status, late.result),
            (JobStatus::Dead, AttemptResult::Paused)
        );
    }

    /// Issue 14, item 8: a re-driven job's horizon counts from its re-drive.
    #[test]
    fn a_re_driven_job_gets_a_fresh_horizon() {
        let p = RetryPolicy::DEFAULT;
        let now = OffsetDateTime::now_utc();
        let mut redriven = job(1, Duration::from_secs(30 * 3600));
        let before = p.decide(&redriven, Delivery::Retry("503".into()), now);
        assert_eq!(before.status, JobStatus::Dead, "30 h old: past its horizon");
        redriven.redriven_at = Some(now);
        let after = p.decide(&redriven, Delivery::Retry("503".into()), now);
        assert_eq!(after.status, JobStatus::Pending);
    }
}
