//! What a worker holds back per job kind, from what the kind's last attempts said about the
//! other side:
//!
//! - **throttled** with a `Retry-After`: no claims of the kind until then (its jobs stay
//!   pending, and other kinds run on), so that the rest of the kind's jobs do not hammer a
//!   provider that asked us to wait;
//! - **paused** (a circuit breaker) after a refusal of our credentials or configuration: no
//!   claims of the kind except **one probe job per interval**
//!   ([`KindOptions::probe_interval`](super::KindOptions::probe_interval)). The probe's outcome,
//!   or any attempt's outcome that is not a refusal, closes the breaker and the kind resumes by
//!   itself; a refusal keeps it open for another interval. Jobs in flight when it opens finish
//!   normally.
//!
//! Only an answer that shows the provider took our credentials closes a pause: a send it
//! accepted, or a throttle. A job skipped before any send (a decoy with no recipient, a link
//! used meanwhile) says nothing about the provider: its probe slot is free again at once. Any
//! other outcome (a plain retry, an unknown outcome, a permanent error: the handler's own or the
//! provider's, which cannot be told apart) keeps the kind paused until the next interval, so a
//! paused kind costs at most one call to the provider per interval, whatever its jobs are.
//!
//! The holds are this worker's own (each worker learns from its own attempts) and read the
//! store's clock, so tests move a manual clock past an interval instead of sleeping. Paused
//! kinds show in the gauge `oncely_outbox_kind_paused{kind}` (1 while paused; with several
//! workers in a process, how many of them hold it paused), refusals in the counter
//! `oncely_outbox_refusals_total{kind}`; a warning is logged when a kind pauses (with the
//! provider's reason) and an info line when it resumes.

use std::collections::HashMap;
use std::time::Duration;

use time::OffsetDateTime;

use crate::job::Delivery;
use crate::policy::RetryPolicy;

/// What an attempt that ran said about the other side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It refused our credentials or configuration ([`Delivery::Refused`]).
    Refused(String),
    /// It throttled, asking for this wait (if it said; already cut to the policy's
    /// `max_delay`): an answer past our credentials.
    Throttled(Option<Duration>),
    /// It accepted the send.
    Accepted,
    /// The handler chose not to send ([`Delivery::Skipped`]): the provider was not asked.
    NotAsked,
    /// Anything else (a plain retry, an unknown outcome, a permanent error): maybe the
    /// provider's answer, maybe the handler's; not proof that our credentials work.
    Inconclusive,
}

impl Verdict {
    /// What `delivery` says, with the `Retry-After` cut as `policy` cuts it.
    pub(super) fn of(delivery: &Delivery, policy: &RetryPolicy) -> Self {
        match delivery {
            Delivery::Refused(reason) => Self::Refused(reason.clone()),
            Delivery::Throttled { after, .. } => {
                Self::Throttled(after.map(|after| after.min(policy.max_delay)))
            }
            Delivery::Sent { .. } => Self::Accepted,
            Delivery::Skipped(_) => Self::NotAsked,
            Delivery::Retry(_) | Delivery::Unknown(_) | Delivery::Permanent(_) => {
                Self::Inconclusive
            }
        }
    }
}

/// One kind's hold.
#[derive(Debug)]
enum Hold {
    /// No claims until `until`.
    Throttled { until: OffsetDateTime },
    /// The breaker is open since `since`: one probe at `next_probe` (none while `probing`).
    Paused {
        since: OffsetDateTime,
        next_probe: OffsetDateTime,
        probing: bool,
    },
}

/// The kinds a claim may take now.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Claimable {
    /// Kinds to claim as usual.
    pub(super) free: Vec<String>,
    /// Paused kinds due for their probe: one job each (each marked as probing until
    /// [`Holds::observe`] hears of it, or [`Holds::no_probe`] says none was claimed).
    pub(super) probes: Vec<String>,
}

/// A worker's holds, by kind.
#[derive(Debug, Default)]
pub(super) struct Holds {
    kinds: HashMap<String, Hold>,
    /// When the provider last accepted a job of each kind (for telling a refusal of one job
    /// from a refusal of our credentials: `executor.rs`, `judge`).
    accepted: HashMap<String, OffsetDateTime>,
}

impl Holds {
    /// The provider accepted a job of `kind` at `at`.
    pub(super) fn accepted(&mut self, kind: &str, at: OffsetDateTime) {
        let last = self.accepted.entry(kind.to_owned()).or_insert(at);
        *last = (*last).max(at);
    }

    /// Whether the provider accepted a job of `kind` at or after `since`.
    pub(super) fn accepted_since(&self, kind: &str, since: OffsetDateTime) -> bool {
        self.accepted.get(kind).is_some_and(|at| *at >= since)
    }

    /// Splits `kinds` at `now` into those to claim freely and those due for a probe; the
    /// others are held. A throttle that has run out is dropped.
    pub(super) fn claimable(&mut self, kinds: &[String], now: OffsetDateTime) -> Claimable {
        let mut claimable = Claimable::default();
        for kind in kinds {
            match self.kinds.get_mut(kind) {
                None => claimable.free.push(kind.clone()),
                Some(Hold::Throttled { until }) if *until <= now => {
                    self.kinds.remove(kind);
                    claimable.free.push(kind.clone());
                }
                Some(Hold::Throttled { .. }) => {}
                Some(Hold::Paused {
                    next_probe,
                    probing,
                    ..
                }) => {
                    if !*probing && *next_probe <= now {
                        *probing = true;
                        claimable.probes.push(kind.clone());
                    }
                }
            }
        }
        claimable
    }

    /// The probe of `kind` claimed no job (none was due, or the claim failed): it may probe
    /// again at the next claim.
    pub(super) fn no_probe(&mut self, kind: &str) {
        if let Some(Hold::Paused { probing, .. }) = self.kinds.get_mut(kind) {
            *probing = false;
        }
    }

    /// Learns from an attempt of `kind` that ended at `now`: `verdict` is what it said, `None`
    /// if its handler did not run (expired, handed back). A refusal opens the breaker (or keeps
    /// it open for another `probe_interval`); an acceptance or a throttle closes it; an attempt
    /// that did not ask the provider frees the probe slot; an inconclusive one keeps the breaker
    /// open until the next interval. A throttle with a wait holds the kind until then.
    pub(super) fn observe(
        &mut self,
        kind: &str,
        verdict: Option<&Verdict>,
        now: OffsetDateTime,
        probe_interval: Duration,
    ) {
        let verdict = match verdict {
            None | Some(Verdict::NotAsked) => {
                self.no_probe(kind);
                return;
            }
            Some(Verdict::Inconclusive) => {
                if let Some(Hold::Paused {
                    next_probe,
                    probing,
                    ..
                }) = self.kinds.get_mut(kind)
                    && *probing
                {
                    *next_probe = now + probe_interval;
                    *probing = false;
                }
                return;
            }
            Some(verdict) => verdict,
        };
        if let Verdict::Refused(reason) = verdict {
            metrics::counter!("oncely_outbox_refusals_total", "kind" => kind.to_owned())
                .increment(1);
            let next_probe = now + probe_interval;
            match self.kinds.get_mut(kind) {
                Some(Hold::Paused {
                    next_probe: next,
                    probing,
                    ..
                }) => {
                    *next = next_probe;
                    *probing = false;
                }
                _ => {
                    tracing::warn!(
                        kind,
                        reason = %reason,
                        probe_interval = ?probe_interval,
                        "outbox kind paused: the provider refused our credentials or \
                         configuration; its jobs wait (no attempt spent), one probe per interval"
                    );
                    metrics::gauge!("oncely_outbox_kind_paused", "kind" => kind.to_owned())
                        .increment(1.0);
                    self.kinds.insert(
                        kind.to_owned(),
                        Hold::Paused {
                            since: now,
                            next_probe,
                            probing: false,
                        },
                    );
                }
            }
            return;
        }
        if let Some(Hold::Paused { since, .. }) = self.kinds.get(kind) {
            let paused_for: Duration = (now - *since).try_into().unwrap_or_default();
            tracing::info!(kind, paused_for = ?paused_for, "outbox kind resumed: the provider accepted again");
            metrics::gauge!("oncely_outbox_kind_paused", "kind" => kind.to_owned()).decrement(1.0);
            self.kinds.remove(kind);
        }
        if let Verdict::Throttled(Some(wait)) = verdict {
            let until = now + *wait;
            match self.kinds.get_mut(kind) {
                Some(Hold::Throttled { until: held }) => *held = (*held).max(until),
                _ => {
                    tracing::info!(kind, wait = ?wait, "outbox kind throttled: no claims of it until the provider's Retry-After");
                    self.kinds
                        .insert(kind.to_owned(), Hold::Throttled { until });
                }
            }
        }
    }
}

impl Drop for Holds {
    /// A worker that stops holds nothing any more.
    fn drop(&mut self) {
        for (kind, hold) in &self.kinds {
            if let Hold::Paused { .. } = hold {
                metrics::gauge!("oncely_outbox_kind_paused", "kind" => kind.clone()).decrement(1.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| (*s).to_owned()).collect()
    }

    const INTERVAL: Duration = Duration::from_secs(30);

    #[test]
    fn a_refusal_pauses_the_kind_with_one_probe_per_interval_until_an_answer_closes_it() {
        let mut holds = Holds::default();
        let t0 = OffsetDateTime::now_utc();
        let all = kinds(&["email", "charge"]);
        let refused = Verdict::Refused("HTTP 401".into());
        holds.observe("email", Some(&refused), t0, INTERVAL);
        let none = Claimable {
            free: kinds(&["charge"]),
            probes: vec![],
        };
        assert_eq!(holds.claimable(&all, t0), none, "paused; other kinds run");
        assert_eq!(holds.claimable(&all, t0 + INTERVAL / 2), none);
        let probe = Claimable {
            free: kinds(&["charge"]),
            probes: kinds(&["email"]),
        };
        assert_eq!(holds.claimable(&all, t0 + INTERVAL), probe);
        assert_eq!(
            holds.claimable(&all, t0 + INTERVAL * 2),
            none,
            "one probe at a time"
        );
        // The probe is refused: another interval.
        let t1 = t0 + INTERVAL + Duration::from_secs(1);
        holds.observe("email", Some(&refused), t1, INTERVAL);
        assert_eq!(holds.claimable(&all, t1 + INTERVAL / 2), none);
        assert_eq!(holds.claimable(&all, t1 + INTERVAL), probe);
        // Its handler did not run (expired): the next claim probes again.
        holds.observe("email", None, t1 + INTERVAL, INTERVAL);
        assert_eq!(holds.claimable(&all, t1 + INTERVAL), probe);
        // Accepted: closed.
        holds.observe("email", Some(&Verdict::Accepted), t1 + INTERVAL, INTERVAL);
        assert_eq!(holds.claimable(&all, t1 + INTERVAL).free, all);
    }

    /// Review of issue 14: a skipped decoy closed the breaker (any outcome but a refusal did),
    /// and the next claim sent a whole batch with the refused key.
    #[test]
    fn only_an_answer_past_our_credentials_closes_a_pause() {
        let mut holds = Holds::default();
        let t0 = OffsetDateTime::now_utc();
        let email = kinds(&["email"]);
        let paused = Claimable::default();
        let probe = Claimable {
            free: vec![],
            probes: email.clone(),
        };
        holds.observe("email", Some(&Verdict::Refused("401".into())), t0, INTERVAL);
        let t1 = t0 + INTERVAL;
        assert_eq!(holds.claimable(&email, t1), probe);
        // The probe was a decoy, skipped before any send: still paused, and it may probe again
        // at once (the provider was not asked).
        holds.observe("email", Some(&Verdict::NotAsked), t1, INTERVAL);
        assert_eq!(holds.claimable(&email, t1), probe);
        // A plain retry, an unknown outcome or a permanent error proves nothing: still paused,
        // the next probe an interval later.
        holds.observe("email", Some(&Verdict::Inconclusive), t1, INTERVAL);
        assert_eq!(holds.claimable(&email, t1), paused);
        assert_eq!(holds.claimable(&email, t1 + INTERVAL / 2), paused);
        assert_eq!(holds.claimable(&email, t1 + INTERVAL), probe);
        // A throttle is an answer past our credentials: resumed (and not held without a wait).
        holds.observe(
            "email",
            Some(&Verdict::Throttled(None)),
            t1 + INTERVAL,
            INTERVAL,
        );
        assert_eq!(holds.claimable(&email, t1 + INTERVAL).free, email);
        // An inconclusive outcome of a kind that is not paused changes nothing.
        holds.observe(
            "email",
            Some(&Verdict::Inconclusive),
            t1 + INTERVAL,
            INTERVAL,
        );
        assert_eq!(holds.claimable(&email, t1 + INTERVAL).free, email);
    }

    #[test]
    fn what_each_outcome_says_about_the_provider() {
        let policy = RetryPolicy::DEFAULT;
        let of = |d: Delivery| Verdict::of(&d, &policy);
        assert_eq!(
            of(Delivery::Sent {
                provider_message_id: None
            }),
            Verdict::Accepted
        );
        assert_eq!(of(Delivery::Skipped("decoy".into())), Verdict::NotAsked);
        for inconclusive in [
            Delivery::Retry("500".into()),
            Delivery::Unknown("timeout".into()),
            Delivery::Permanent("422".into()),
        ] {
            assert_eq!(of(inconclusive), Verdict::Inconclusive);
        }
    }

    #[test]
    fn a_probe_that_found_no_job_may_probe_again() {
        let mut holds = Holds::default();
        let t0 = OffsetDateTime::now_utc();
        holds.observe("email", Some(&Verdict::Refused("535".into())), t0, INTERVAL);
        let email = kinds(&["email"]);
        assert_eq!(holds.claimable(&email, t0 + INTERVAL).probes, email);
        holds.no_probe("email");
        assert_eq!(holds.claimable(&email, t0 + INTERVAL).probes, email);
    }

    #[test]
    fn a_throttle_with_a_wait_holds_the_kind_until_then() {
        let mut holds = Holds::default();
        let t0 = OffsetDateTime::now_utc();
        let email = kinds(&["email"]);
        holds.observe("email", Some(&Verdict::Throttled(None)), t0, INTERVAL);
        assert_eq!(holds.claimable(&email, t0).free, email, "no wait: no hold");
        let wait = Duration::from_secs(120);
        holds.observe("email", Some(&Verdict::Throttled(Some(wait))), t0, INTERVAL);
        holds.observe("email", Some(&Verdict::Accepted), t0, INTERVAL);
        assert_eq!(holds.claimable(&email, t0 + wait / 2), Claimable::default());
        assert_eq!(holds.claimable(&email, t0 + wait).free, email);
    }

    #[test]
    fn a_throttled_policy_cuts_the_wait_it_holds_for() {
        let policy = RetryPolicy::DEFAULT;
        let delivery = Delivery::Throttled {
            reason: "429".into(),
            after: Some(Duration::from_secs(1 << 40)),
        };
        assert_eq!(
            Verdict::of(&delivery, &policy),
            Verdict::Throttled(Some(policy.max_delay))
        );
    }

    #[test]
    fn a_paused_kind_shows_in_its_gauge_and_refusals_are_counted() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        // What changed since the last look (a debugging snapshot drains what it reports):
        // (the paused gauge's change, refusals counted).
        let look = || {
            let mut seen = (None, 0.0);
            for (key, _, _, value) in snapshotter.snapshot().into_vec() {
                let key = key.key();
                if !key
                    .labels()
                    .any(|l| l.key() == "kind" && l.value() == "email")
                {
                    continue;
                }
                match (key.name(), value) {
                    ("oncely_outbox_kind_paused", DebugValue::Gauge(g)) => {
                        seen.0 = Some(g.into_inner())
                    }
                    ("oncely_outbox_refusals_total", DebugValue::Counter(n)) => seen.1 = n as f64,
                    _ => {}
                }
            }
            seen
        };
        metrics::with_local_recorder(&recorder, || {
            let t0 = OffsetDateTime::now_utc();
            let mut holds = Holds::default();
            let refused = Verdict::Refused("HTTP 401".into());
            holds.observe("email", Some(&refused), t0, INTERVAL);
            holds.observe("email", Some(&refused), t0, INTERVAL);
            assert_eq!(look(), (Some(1.0), 2.0), "paused once, refused twice");
            holds.observe("email", Some(&Verdict::Accepted), t0, INTERVAL);
            assert_eq!(look(), (Some(-1.0), 0.0), "resumed");
            holds.observe("email", Some(&refused), t0, INTERVAL);
            assert_eq!(look(), (Some(1.0), 1.0));
            drop(holds);
            assert_eq!(look(), (Some(-1.0), 0.0), "a stopped worker holds nothing");
        });
    }
}
