//! Running one attempt: the job's handler in a task of its own, outside any transaction, bounded
//! by the lease; its outcome turned into what to record by the kind's retry policy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use time::OffsetDateTime;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use super::backoff::Backoff;
use super::holds::{Holds, Verdict};
use super::{Registered, Worker};
use crate::job::{AttemptResult, Delivery, Ended, Job, JobStatus, MarkFuture, PointOfNoReturn};
use crate::policy::{OnUnknown, RetryPolicy};
use crate::store::{Finish, JobStore};

/// A job whose attempt ended, and what to record of it (`None`: handed back unstarted).
pub(super) struct Ran {
    pub(super) job: Job,
    pub(super) finish: Option<Finish>,
    /// What the attempt said about the other side (`None`: its handler did not run), for the
    /// worker's holds.
    pub(super) verdict: Option<Verdict>,
}

/// The share of the lease a handler may run, counted from before the claim.
const SEND_SHARE: f64 = 0.9;

/// The share of the lease by whose end [`Handler::then`](super::Handler::then) must have named
/// the follow-ups, counted from before the claim: the rest is for recording them.
const THEN_SHARE: f64 = 0.95;

impl<S: JobStore> Worker<S> {
    /// When the handlers of jobs a claim sent now returns must stop: 90 % of the lease from
    /// now. Taken *before* the claim: the lease starts when the database runs it, which may be
    /// long before it returns (a lock wait, a busy database), and the handler must stop before
    /// the lease ends.
    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.config.lease.mul_f64(SEND_SHARE)
    }

    /// Starts one job's attempt in a task of its own; its handler is stopped at `deadline`
    /// ([`Worker::deadline`], taken before the claim).
    pub(super) fn spawn(&self, job: Job, deadline: Instant) -> JoinHandle<Ran> {
        let registered = self.handlers.get(&job.kind).cloned();
        let store = self.store.clone();
        let holds = self.holds.clone();
        let then_by = deadline + self.config.lease.mul_f64(THEN_SHARE - SEND_SHARE);
        let deadlines = (deadline, then_by);
        tokio::spawn(attempt(registered, (store, holds), deadlines, job).in_current_span())
    }
}

/// Runs one job. A job settled as sent is recorded sent without running; a job past its deadline
/// is not run (`expired`), nor a retry claimed after its retry horizon (`dead`); a handler that
/// panics or runs past `deadline` is an unknown outcome, retried with the same delivery key —
/// or, if its kind reconciles ([`OnUnknown::Reconcile`]), parked, as is a retry whose previous
/// attempt its worker abandoned ([`parked_after_abandoned`]). A final status comes with the
/// handler's follow-ups, named by `then_by` ([`with_follow_ups`]).
async fn attempt<S: JobStore>(
    registered: Option<Registered>,
    (store, holds): (S, Arc<Mutex<Holds>>),
    (deadline, then_by): (Instant, Instant),
    job: Job,
) -> Ran {
    let marks = registered.as_ref().is_some_and(Registered::marks);
    let Some(Registered { handler, options }) = registered else {
        // Claims only ask for registered kinds; keep the job for a worker that has it.
        if let Err(error) = store.release(&job).await {
            tracing::warn!(job = job.id, %error, "could not hand a job back; it is due again when its lease ends");
        }
        return Ran {
            job,
            finish: None,
            verdict: None,
        };
    };
    let now = store.now();
    let horizon = options.policy.horizon;
    let then = handler.clone();
    let reconciles = options.on_unknown == OnUnknown::Reconcile;
    let (mut finish, verdict) = if job.settled_as_sent {
        let why = "not run: settled as sent (the provider accepted an earlier attempt)";
        let settled = Finish {
            error: Some(why.to_owned()),
            ..Finish::sent(None)
        };
        (settled, None)
    } else if reconciles
        // Before the deadline and horizon checks: an attempt that may have been delivered is
        // parked (the truth about it), not reported dead.
        && let Some(parked) = parked_after_abandoned(&store, &job, &options.policy).await
    {
        (parked, None)
    } else if job.not_after.is_some_and(|deadline| deadline <= now) {
        let why = "not run: its deadline passed before delivery".to_owned();
        (Finish::dead(AttemptResult::Expired, why), None)
    } else if job.attempt - job.free_attempts > 1 && now - job.horizon_from() > horizon {
        // A retry claimed late (its kind was paused or held, the workers were down) after an
        // attempt that may have reached the provider (a plain retry, an unknown outcome: not a
        // throttle or a refusal, which store nothing there), whose deduplication window has
        // passed.
        let why = format!(
            "not run: claimed after its {horizon:?} retry horizon, so a provider may no longer \
             deduplicate an earlier attempt; re-drive it to send (oncely outbox retry)"
        );
        (Finish::dead(AttemptResult::Dead, why), None)
    } else {
        let frozen_at_claim = job.frozen.is_some();
        let delivery = run(handler, &store, job.clone(), deadline, marks).await;
        let refused = matches!(delivery, Delivery::Refused(_));
        let delivery = judge(&holds, &job.kind, now, delivery, store.now());
        let verdict = Verdict::of(&delivery, &options.policy);
        let mut finish = options.policy.decide(&job, delivery, now);
        // What this attempt froze went nowhere if the provider throttled or refused it: the
        // next attempt (a re-drive's too, if the job died of it) freezes anew, so a sender fixed
        // after a refusal reaches this job. What an earlier attempt froze stays: that attempt may
        // have reached the provider.
        finish.thaw = !frozen_at_claim
            && (refused
                || matches!(
                    finish.result,
                    AttemptResult::Throttled | AttemptResult::Paused
                ));
        if reconciles && finish.result == AttemptResult::Unknown {
            // Retried or dead, it may have reached the provider: neither resent nor given up.
            finish = finish.parked();
        }
        (finish, Some(verdict))
    };
    if let Some(end) = finish.ended() {
        let retry_in = options.policy.delay(1);
        let sent = matches!(end, Ended::Sent { .. });
        finish = with_follow_ups(&*then, &job, end, finish, then_by, retry_in).await;
        if reconciles && sent && !job.settled_as_sent && finish.status == JobStatus::Pending {
            // Sent, but its final status could not be recorded (the follow-ups failed): not run
            // again blindly either. Settled as sent, its follow-ups are asked for then. (A job
            // that died or was skipped reached no one: it is run again as under `Resend`; a job
            // settled as sent stays pending with its settlement, which the next claim carries.)
            finish = finish.parked();
        }
    }
    report(&job, &finish);
    Ran {
        job,
        finish: Some(finish),
        verdict,
    }
}

/// Under [`OnUnknown::Reconcile`], a retry whose previous attempt was abandoned by its worker
/// (it died, or lost its lease, mid-attempt) after its point of no return — the provider may
/// have accepted it — is not run but parked, spending no attempt. So is one whose previous
/// attempt's mark is unknown (an earlier release's, or a handler's that does not record it:
/// [`Handler::marks_point_of_no_return`](super::Handler::marks_point_of_no_return)): it may
/// have reached the provider at any moment. An abandoned attempt that was still `ahead` of its
/// point of no return handed nothing over (the mark is written, and must succeed, before
/// anything is): the retry runs as any retry. `None`: run it. A first attempt (of the job, or
/// since it was re-driven or settled for resending) has no previous attempt of its own to look
/// at. If the history cannot be read, nothing is sent: a retry, spending no attempt.
async fn parked_after_abandoned<S: JobStore>(
    store: &S,
    job: &Job,
    policy: &RetryPolicy,
) -> Option<Finish> {
    if job.attempt <= 1 {
        return None;
    }
    let attempts = match store.attempts(job.id).await {
        Ok(attempts) => attempts,
        Err(error) => {
            let why = format!("not run: its attempt history could not be read: {error}");
            return Some(Finish::retry_free(
                AttemptResult::Retry,
                policy.delay(1),
                why,
            ));
        }
    };
    // In id order: this claim's attempt (open) last, the ones before it just ahead.
    let mut latest = attempts.iter().rev();
    if latest.next()?.finished_at.is_some() {
        return None;
    }
    // Every abandoned attempt since the last one that ended with a result that settles them: a
    // worker can be killed after its claim closed an abandoned attempt and before it parked the
    // job, and the attempt it leaves (still `ahead`, it never ran) says nothing of the one
    // before it, which may have passed its point of no return. Nor does a retry that handed
    // nothing over (`ahead`: a claim that could not read this history, a send refused before
    // its mark) — the scan goes on past it; only a claim that read the history and parked, or
    // an attempt that may have handed something over, ends it.
    let abandoned: Vec<_> = latest
        .take_while(|a| match a.result.as_deref() {
            Some("abandoned") => true,
            Some("retry") => a.handed_nothing_over(),
            _ => false,
        })
        .collect();
    // Only abandoned attempts can leave the outcome open.
    let previous = abandoned
        .iter()
        .find(|a| a.result.as_deref() == Some("abandoned"))?;
    let Some(reached) = abandoned.iter().find(|a| !a.handed_nothing_over()) else {
        tracing::info!(
            job = job.id,
            attempt = previous.attempt,
            "an abandoned attempt had not reached its point of no return (nothing was handed over): retried, not parked"
        );
        return None;
    };
    let why = match reached.point_of_no_return {
        Some(_) => format!(
            "not run: attempt {} was abandoned by its worker past its point of no return",
            reached.attempt
        ),
        None => format!(
            "not run: attempt {} was abandoned by its worker mid-attempt",
            reached.attempt
        ),
    };
    Some(Finish::retry_free(AttemptResult::Parked, policy.delay(1), why).parked())
}

/// `finish`, a final status, with the follow-up jobs the handler names for it
/// ([`Handler::then`](super::Handler::then)) by `then_by`, asked again after an error (with
/// backoff) while time is left. If it cannot name them (errors until `then_by`, a panic, no
/// answer in time), the final status is not recorded without them: the job stays pending, due
/// again in `retry_in`, its attempt `unknown` and free (see `then`'s docs).
async fn with_follow_ups(
    handler: &dyn super::Handler,
    job: &Job,
    end: Ended,
    mut finish: Finish,
    then_by: Instant,
    retry_in: std::time::Duration,
) -> Finish {
    let mut backoff = Backoff::until(then_by);
    let why = loop {
        let then = std::panic::AssertUnwindSafe(handler.then(job, &end)).catch_unwind();
        let error = match tokio::time::timeout_at(then_by, then).await {
            Ok(Ok(Ok(follow_ups))) => {
                finish.follow_ups = follow_ups;
                return finish;
            }
            Ok(Ok(Err(error))) => error.to_string(),
            Ok(Err(_)) => break "the handler's `then` panicked".to_owned(),
            Err(_) => break "the handler's `then` did not answer in time".to_owned(),
        };
        // Asked again: the job ending pending instead would run its handler again, which a
        // provider that does not deduplicate (plain SMTP) delivers a second time.
        let Some(delay) = backoff.next() else {
            break error;
        };
        tracing::warn!(job = job.id, %error, retry_in = ?delay, "naming an attempt's follow-ups failed; asking again");
        metrics::counter!("oncely_outbox_then_retries_total").increment(1);
        tokio::time::sleep(delay).await;
    };
    let status = match &finish.error {
        Some(reason) => format!("{} ({reason})", end.status().as_str()),
        None => end.status().as_str().to_owned(),
    };
    let error = format!(
        "{status}, but not recorded: its follow-up jobs could not be named ({why}); retried \
         under the same delivery key, spending no attempt"
    );
    Finish {
        provider_message_id: finish.provider_message_id,
        ..Finish::retry_free(AttemptResult::Unknown, retry_in, error)
    }
}

/// What an attempt of `kind` that started at `started` and ended at `ended` says, in the light
/// of the kind's other attempts: a refusal while the provider accepted other jobs of the kind
/// after this one started is about this job (a payload the provider will not take from us, such
/// as a sender it refuses), not about our credentials — it is this job's failure, a plain retry
/// that spends its budget, and the kind is not paused (one such job would otherwise pause it
/// every interval until its horizon). An acceptance is noted for that judgement.
fn judge(
    holds: &Mutex<Holds>,
    kind: &str,
    started: OffsetDateTime,
    delivery: Delivery,
    ended: OffsetDateTime,
) -> Delivery {
    let mut holds = holds.lock().unwrap_or_else(PoisonError::into_inner);
    match delivery {
        Delivery::Sent { .. } => {
            holds.accepted(kind, ended);
            delivery
        }
        Delivery::Refused(reason) if holds.accepted_since(kind, started) => {
            Delivery::Retry(format!(
                "refused for this job alone (the provider accepted other jobs of its kind meanwhile): \
             {reason}"
            ))
        }
        other => other,
    }
}

/// The handler's outcome, on the job as frozen ([`frozen`]); a panic or running past
/// `deadline` is unknown. With `marks` (the claim armed the attempt: [`Registered::marks`]),
/// the handler records its point of no return in the attempt's row ([`Mark`]); an unknown
/// outcome before that point is a plain retry — nothing was handed over, so nothing can have
/// reached the provider (a connection lost before `DATA`, a timeout while connecting).
async fn run<S: JobStore>(
    handler: Arc<dyn super::Handler>,
    store: &S,
    job: Job,
    deadline: Instant,
    marks: bool,
) -> Delivery {
    let limit = deadline.saturating_duration_since(Instant::now());
    let mark = Mark {
        store,
        job: job.clone(),
        passed: AtomicBool::new(false),
    };
    let unrecorded = crate::job::Unrecorded;
    let point: &dyn PointOfNoReturn = if marks { &mark } else { &unrecorded };
    let attempt = async move {
        match frozen(&*handler, store, job).await {
            Ok(job) => handler.run_marked(&job, point).await,
            Err(outcome) => outcome,
        }
    };
    let run = std::panic::AssertUnwindSafe(attempt).catch_unwind();
    let delivery = match tokio::time::timeout_at(deadline, run).await {
        Ok(Ok(delivery)) => delivery,
        Ok(Err(_)) => Delivery::Unknown("the handler panicked".into()),
        Err(_) => Delivery::Unknown(format!(
            "the handler did not finish within {limit:.1?} (90 % of the lease, counted from the claim)"
        )),
    };
    match delivery {
        Delivery::Unknown(why) if marks && !mark.passed.load(Ordering::SeqCst) => Delivery::Retry(
            format!("{why}; before its point of no return: nothing was handed over"),
        ),
        delivery => delivery,
    }
}

/// An attempt's point of no return, recorded in its row ([`JobStore::pass_point_of_no_return`]:
/// one write, fenced by the claim's lease token) before the handler hands anything over. If the
/// write fails — the database is unreachable, or the lease ended and another worker took the
/// job — the handler is told so and hands nothing over: never a message without its mark.
/// `passed` says whether it was recorded (an unknown outcome before that is a plain retry).
struct Mark<'a, S> {
    store: &'a S,
    job: Job,
    passed: AtomicBool,
}

impl<S: JobStore> PointOfNoReturn for Mark<'_, S> {
    fn reached(&self) -> MarkFuture<'_> {
        Box::pin(async move {
            match self.store.pass_point_of_no_return(&self.job).await {
                Ok(true) => {
                    self.passed.store(true, Ordering::SeqCst);
                    Ok(())
                }
                Ok(false) => Err(
                    "not sent: the claim's lease ended before the point of no return was recorded"
                        .to_owned(),
                ),
                Err(error) => Err(format!(
                    "not sent: the point of no return could not be recorded: {error}"
                )),
            }
        })
    }
}

/// The job with what its attempts send: frozen by an earlier attempt (it came with the claim),
/// or asked of the handler now and stored before anything is sent. `Err`: the outcome to report
/// instead of running (the handler's, or a retry when the value could not be stored: nothing
/// was sent).
async fn frozen<S: JobStore>(
    handler: &dyn super::Handler,
    store: &S,
    mut job: Job,
) -> Result<Job, Delivery> {
    if job.frozen.is_some() {
        return Ok(job);
    }
    let Some(value) = handler.freeze(&job).await? else {
        return Ok(job);
    };
    match store.freeze(&job, &value).await {
        Ok(Some(stored)) => {
            job.frozen = Some(stored);
            Ok(job)
        }
        Ok(None) => Err(Delivery::Retry(
            "not sent: the claim's lease ended before the payload was frozen".into(),
        )),
        Err(error) => Err(Delivery::Retry(format!(
            "not sent: the payload could not be frozen: {error}"
        ))),
    }
}

/// Counts the attempt and logs it (a warning when the job died of it).
fn report(job: &Job, finish: &Finish) {
    let result = finish.result.as_str();
    metrics::counter!("oncely_outbox_attempts_total", "kind" => job.kind.clone(), "result" => result)
        .increment(1);
    let error = finish.error.as_deref();
    match finish.status {
        JobStatus::Dead => {
            tracing::warn!(job = job.id, kind = %job.kind, attempt = job.attempt, result, error, "outbox job is dead");
        }
        JobStatus::Unknown => {
            tracing::warn!(job = job.id, kind = %job.kind, attempt = job.attempt, result, error, "outbox job parked: settle it");
        }
        _ => {
            tracing::info!(job = job.id, kind = %job.kind, attempt = job.attempt, result, error, "outbox attempt");
        }
    }
}
