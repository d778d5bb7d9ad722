//! Jobs as enqueued, claimed and recorded; what a delivery attempt reports.

use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

/// A job to enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    /// Names the business intent, unique: `invoice:inv_123:finalize`. Never a queue's job id.
    pub operation_key: String,
    /// Which handler runs it (`email.verification`, `charge`, …).
    pub kind: String,
    /// The handler's input.
    pub payload: Value,
    /// Do not run after this moment (a link that expired is not sent): the job goes dead with
    /// `expired` instead.
    pub not_after: Option<OffsetDateTime>,
    /// The partition of its kind it belongs to (a webhook's endpoint), if any: a kind with
    /// [`KindOptions::per_partition`](crate::KindOptions::per_partition) runs at most that many
    /// jobs of one partition at once in a worker. Kinds without that limit ignore it.
    pub partition: Option<String>,
}

impl NewJob {
    /// A job with no expiry.
    pub fn new(operation_key: impl Into<String>, kind: impl Into<String>, payload: Value) -> Self {
        Self {
            operation_key: operation_key.into(),
            kind: kind.into(),
            payload,
            not_after: None,
            partition: None,
        }
    }

    /// Puts the job in partition `key` of its kind ([`NewJob::partition`]).
    pub fn partition(mut self, key: impl Into<String>) -> Self {
        self.partition = Some(key.into());
        self
    }

    /// Sets the moment after which the job must not run.
    pub fn not_after(mut self, at: OffsetDateTime) -> Self {
        self.not_after = Some(at);
        self
    }
}

/// What enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// A new job with this id.
    Inserted(i64),
    /// A job with this operation key already exists: nothing was added.
    AlreadyExists,
}

/// A claimed job, handed to its handler.
#[derive(Debug, Clone)]
pub struct Job {
    /// Row id.
    pub id: i64,
    /// The business intent.
    pub operation_key: String,
    /// The handler kind.
    pub kind: String,
    /// The handler's input.
    pub payload: Value,
    /// Stable for this job across every attempt: forward it downstream.
    pub delivery_key: Uuid,
    /// This attempt's number, from 1 (since the job was enqueued or last re-driven): every
    /// attempt has its own, throttled and paused ones included.
    pub attempt: i32,
    /// How many attempts before this one spent none of the attempt budget (throttled or paused:
    /// [`Delivery::Throttled`], [`Delivery::Refused`]). The budget spent so far is
    /// `attempt - 1 - free_attempts`.
    pub free_attempts: i32,
    /// When the job was enqueued.
    pub created_at: OffsetDateTime,
    /// When an operator last re-drove it ([`JobStore::redrive`](crate::JobStore::redrive)), if
    /// ever: its retry horizon counts from here then ([`Job::horizon_from`]).
    pub redriven_at: Option<OffsetDateTime>,
    /// See [`NewJob::not_after`].
    pub not_after: Option<OffsetDateTime>,
    /// The claim's lease token: finishing requires it.
    pub lease_token: Uuid,
    /// What the job's first attempt froze ([`Handler::freeze`](crate::Handler::freeze)): the
    /// same on every attempt of the job, so that every retry under its delivery key carries
    /// the same payload. `None` until an attempt froze something (and always for handlers that
    /// freeze nothing).
    pub frozen: Option<Value>,
    /// See [`NewJob::partition`].
    pub partition: Option<String>,
    /// The job was parked and then settled as sent ([`Settlement::Sent`](crate::Settlement)):
    /// the worker records it sent without running its handler, naming its follow-ups
    /// ([`Handler::then`](crate::Handler::then)) as for any sent job.
    pub settled_as_sent: bool,
}

impl Job {
    /// Where the retry horizon counts from: the last re-drive, or else the enqueue. A re-driven
    /// job gets a fresh horizon (its `created_at` is kept for history).
    pub fn horizon_from(&self) -> OffsetDateTime {
        self.redriven_at.unwrap_or(self.created_at)
    }
}

/// What a handler or a mailer returns: the attempt, boxed (its traits stay object-safe).
pub type DeliveryFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Delivery> + Send + 'a>>;

/// What [`PointOfNoReturn::reached`] returns, boxed: `Ok(())` when the moment is recorded (hand
/// the message over), `Err(why)` when it is not (hand nothing over: the attempt ends as a plain
/// retry, [`Delivery::Retry`]).
pub type MarkFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>>;

/// An attempt's point of no return: the moment its message is handed over to the provider —
/// over SMTP once `MAIL`, `RCPT` and `DATA` were accepted, before the message's content is
/// sent; over HTTP before the request is sent. A transport that can tell that moment calls
/// [`PointOfNoReturn::reached`] there, waits for it, and hands nothing over if it fails
/// (the mailer's `send_marked`).
///
/// In a worker ([`Handler::run_marked`](crate::Handler::run_marked)) it is a durable write to
/// the attempt's row, fenced by the claim's lease token (one round trip to the database per
/// send): so a worker killed mid-attempt leaves a row that says whether the message may have
/// reached the provider. An attempt abandoned before the moment is retried as any retry; one
/// abandoned after it — or whose mark is unknown (an earlier release, a transport without the
/// hook) — is parked under [`OnUnknown::Reconcile`](crate::OnUnknown), as it may have been
/// delivered. The write fails when the database cannot be reached or the claim's lease was
/// lost: then nothing is sent, never a message without its mark.
pub trait PointOfNoReturn: Send + Sync {
    /// Records that the message is about to be handed over; `Err`: hand nothing over.
    fn reached(&self) -> MarkFuture<'_>;
}

/// A point of no return recorded nowhere: for a send outside a worker, where nobody asks
/// afterwards (the mailer's `send` uses it).
#[derive(Debug, Clone, Copy, Default)]
pub struct Unrecorded;

impl PointOfNoReturn for Unrecorded {
    fn reached(&self) -> MarkFuture<'_> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// What [`Handler::freeze`](crate::Handler::freeze) returns, boxed: `Ok(Some(value))` to freeze
/// `value`, `Ok(None)` when there is nothing to freeze, `Err(outcome)` to end the attempt with
/// `outcome` without running it.
pub type FreezeFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<Value>, Delivery>> + Send + 'a>,
>;

/// What [`Handler::then`](crate::Handler::then) returns, boxed: the follow-up jobs to enqueue
/// with the job's final status, or why they could not be made (then the final status is not
/// recorded either: see [`Handler::then`](crate::Handler::then)).
pub type ThenFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Vec<NewJob>, ThenError>> + Send + 'a>,
>;

/// Why [`Handler::then`](crate::Handler::then) could not name a job's follow-ups (a database it
/// reads was unreachable…).
pub type ThenError = Box<dyn std::error::Error + Send + Sync>;

/// How a job ended: the final status its attempt is about to record, as
/// [`Handler::then`](crate::Handler::then) sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Sent ([`JobStatus::Sent`]).
    Sent {
        /// The provider's id of the delivery, if it gave one.
        provider_message_id: Option<String>,
    },
    /// Dead ([`JobStatus::Dead`]): failed for good, gave up after its budget or horizon, or
    /// claimed after its deadline ([`AttemptResult::Expired`]: never run).
    Dead {
        /// The last attempt's result (`dead`, `retry`, `unknown`, `expired`…).
        result: AttemptResult,
        /// Why it is dead (what [`JobRecord::last_error`] will say).
        reason: String,
    },
    /// Skipped by its handler ([`JobStatus::Skipped`], [`Delivery::Skipped`]).
    Skipped {
        /// The handler's reason.
        reason: String,
    },
}

impl Ended {
    /// The final status.
    pub fn status(&self) -> JobStatus {
        match self {
            Self::Sent { .. } => JobStatus::Sent,
            Self::Dead { .. } => JobStatus::Dead,
            Self::Skipped { .. } => JobStatus::Skipped,
        }
    }
}

/// What one attempt reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The effect happened (the provider accepted).
    Sent {
        /// The provider's id for it, if any.
        provider_message_id: Option<String>,
    },
    /// It did not happen; try again later (after the policy's backoff, spending an attempt).
    Retry(String),
    /// It did not happen because the other side is throttling (HTTP 429, a 503 with
    /// `Retry-After`, SMTP 421/450/451): try again after the later of the policy's backoff and
    /// `after`. Spends no attempt of the budget (the horizon still applies); recorded as
    /// `throttled`. A worker that sees an `after` holds the kind's claims until then.
    Throttled {
        /// What the other side said.
        reason: String,
        /// How long it asked us to wait (`Retry-After`), if it said.
        after: Option<std::time::Duration>,
    },
    /// It did not happen because the other side refused our credentials or configuration
    /// (HTTP 401/403/407, SMTP 530/534/535/538): nothing is wrong with the job. It stays
    /// pending, spends no attempt, is recorded as `paused`, and the worker pauses the kind: one
    /// probe job per [`KindOptions::probe_interval`](crate::KindOptions::probe_interval) until
    /// one is not refused.
    Refused(String),
    /// It may or may not have happened (timeout after handing over): retry with the same key.
    Unknown(String),
    /// It can never happen (rejected as invalid): dead now.
    Permanent(String),
    /// Deliberately not run (nobody to send to, rate-limited): the job ends `skipped` now
    /// ([`JobStatus::Skipped`]), its attempt recorded as `skipped` with this reason. Not a
    /// failure: never dead, never re-driven.
    Skipped(String),
}

/// What a reconciler learned of a parked job ([`JobStatus::Unknown`]) from its provider
/// ([`Handler::reconcile`](crate::Handler::reconcile)): did the provider accept a message
/// under the job's delivery key?
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// It did: the job is settled as sent ([`Settlement::Sent`](crate::Settlement)), nothing is
    /// sent again.
    Accepted {
        /// The provider's id of the delivery, if it gave one.
        provider_message_id: Option<String>,
    },
    /// It did not: once the job has been parked for a lease (a message the provider was still
    /// taking when the attempt gave up has been taken or refused by then), the job is settled
    /// for resending ([`Settlement::Resend`](crate::Settlement)); before that it is asked again
    /// then.
    NotAccepted,
    /// It cannot say now (the lookup failed, timed out, answered something else): asked again
    /// later, less and less often.
    Unknown(String),
}

/// What [`Handler::reconcile`](crate::Handler::reconcile) and
/// the mailer's `look_up` return, boxed.
pub type ReconcileFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Reconciled> + Send + 'a>>;

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Waiting to run (or running under a lease).
    Pending,
    /// Done.
    Sent,
    /// Given up after a failure, with a reason: an operator may re-drive it.
    Dead,
    /// Deliberately not run ([`Delivery::Skipped`]: nobody to send to, rate-limited), with the
    /// reason. Not a failure: never re-driven.
    Skipped,
    /// Parked: an attempt may or may not have reached the provider (an unknown outcome, an
    /// attempt its worker abandoned), and its kind reconciles instead of resending
    /// ([`OnUnknown::Reconcile`](crate::OnUnknown)). It waits, its attempts kept, until it is
    /// settled ([`JobStore::settle`](crate::JobStore::settle)): sent, or pending again.
    Unknown,
}

impl JobStatus {
    /// Every status (`oncely outbox list --status` offers these): a new status is listed here
    /// too, beside its arm in [`JobStatus::as_str`].
    pub const ALL: [JobStatus; 5] = [
        Self::Pending,
        Self::Sent,
        Self::Dead,
        Self::Skipped,
        Self::Unknown,
    ];

    /// The stored text: `pending`, `sent`, `dead`, `skipped`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sent => "sent",
            Self::Dead => "dead",
            Self::Skipped => "skipped",
            Self::Unknown => "unknown",
        }
    }

    /// The status whose stored text is `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

/// Reads the stored text (anything unknown is pending, as the worker treats it).
impl From<String> for JobStatus {
    fn from(s: String) -> Self {
        match s.as_str() {
            "sent" => Self::Sent,
            "dead" => Self::Dead,
            "skipped" => Self::Skipped,
            "unknown" => Self::Unknown,
            _ => Self::Pending,
        }
    }
}

/// How a worker's attempt ended, as recorded in `oncely_outbox_attempts.result` (the column keeps
/// these texts). The store itself writes one more, `abandoned`, when it claims a job whose
/// earlier attempt never finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttemptResult {
    /// The effect happened.
    Sent,
    /// It did not happen: retried after a delay (or dead, when the policy gave up).
    Retry,
    /// It may have happened: retried with the same delivery key (or dead, when the policy gave
    /// up).
    Unknown,
    /// Rejected for good.
    Dead,
    /// Claimed after its deadline ([`NewJob::not_after`]): never run.
    Expired,
    /// The handler chose not to run it ([`Delivery::Skipped`]).
    Skipped,
    /// The other side throttled ([`Delivery::Throttled`]): retried, no attempt spent.
    Throttled,
    /// The other side refused the credentials or configuration ([`Delivery::Refused`]): the
    /// job waits for its kind to resume, no attempt spent.
    Paused,
    /// Not run: the attempt before it was abandoned by its worker (it may have reached the
    /// provider) and the kind reconciles instead of resending
    /// ([`OnUnknown::Reconcile`](crate::OnUnknown)): the job parked, no attempt spent.
    Parked,
}

impl AttemptResult {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sent => "sent",
            Self::Retry => "retry",
            Self::Unknown => "unknown",
            Self::Dead => "dead",
            Self::Expired => "expired",
            Self::Skipped => "skipped",
            Self::Throttled => "throttled",
            Self::Paused => "paused",
            Self::Parked => "parked",
        }
    }
}

impl std::fmt::Display for AttemptResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job as stored, for operators and tests.
#[derive(Debug, Clone, Serialize)]
pub struct JobRecord {
    /// Row id.
    pub id: i64,
    /// The business intent.
    pub operation_key: String,
    /// Handler kind.
    pub kind: String,
    /// Status.
    pub status: JobStatus,
    /// Attempts started so far (since it was enqueued or last re-driven): the budget's count.
    pub attempts: i32,
    /// Attempts over the job's whole life, every re-drive included (its attempt rows).
    pub all_attempts: i64,
    /// How many of them spent none of the attempt budget (throttled, paused).
    pub free_attempts: i32,
    /// The last error, or the reason it is dead.
    pub last_error: Option<String>,
    /// The provider's id of the delivery.
    pub provider_message_id: Option<String>,
    /// The payload.
    pub payload: Value,
    /// The delivery key.
    pub delivery_key: Uuid,
    /// What its first attempt froze ([`Job::frozen`]).
    pub frozen: Option<Value>,
    /// Its partition ([`NewJob::partition`]).
    pub partition: Option<String>,
    /// When it was enqueued.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When it is due next (pending; while an attempt runs, when that attempt's lease ends).
    /// Kept as it was when the job finished.
    #[serde(with = "time::serde::rfc3339")]
    pub run_after: OffsetDateTime,
    /// When it was sent.
    #[serde(with = "time::serde::rfc3339::option")]
    pub sent_at: Option<OffsetDateTime>,
    /// When it died.
    #[serde(with = "time::serde::rfc3339::option")]
    pub dead_at: Option<OffsetDateTime>,
    /// When its handler skipped it ([`JobStatus::Skipped`]).
    #[serde(with = "time::serde::rfc3339::option")]
    pub skipped_at: Option<OffsetDateTime>,
    /// When an operator last re-drove it ([`Job::redriven_at`]).
    #[serde(with = "time::serde::rfc3339::option")]
    pub redriven_at: Option<OffsetDateTime>,
    /// Parked jobs ([`JobStatus::Unknown`]): since when.
    #[serde(with = "time::serde::rfc3339::option")]
    pub parked_at: Option<OffsetDateTime>,
}

/// One attempt as recorded: the history an incident review needs.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptRecord {
    /// Attempt number, from 1 since the job was enqueued or last re-driven (a re-drive starts
    /// again at 1, so a 1 after the first attempt marks one).
    pub attempt: i32,
    /// The worker that made it.
    pub worker: String,
    /// An [`AttemptResult`] as stored (`sent`, `retry`, …; `abandoned`: the worker's lease ran
    /// out first), or `None` while running. Kept as text: a newer release may write a result
    /// this one does not know.
    pub result: Option<String>,
    /// The provider's id, if sent.
    pub provider_message_id: Option<String>,
    /// What went wrong.
    pub error: Option<String>,
    /// Whether it has finished.
    pub finished: bool,
    /// When it started.
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// When it ended (`None` while running).
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    /// Where it stands with its point of no return ([`PointOfNoReturn`]): `ahead` (its worker
    /// records the moment its message is handed over, and had not reached it), `passed` (it
    /// had: the message may have reached the provider), or `None` — unknown: an attempt of an
    /// earlier release, or of a handler that does not record the moment. Kept as text, as
    /// `result`.
    pub point_of_no_return: Option<String>,
    /// When it passed its point of no return.
    #[serde(with = "time::serde::rfc3339::option")]
    pub handed_over_at: Option<OffsetDateTime>,
}

impl AttemptRecord {
    /// Whether this attempt surely handed nothing over: its worker records its point of no
    /// return and had not reached it (`ahead`). An attempt that passed it, or whose mark is
    /// unknown, may have reached the provider.
    pub fn handed_nothing_over(&self) -> bool {
        self.point_of_no_return.as_deref() == Some("ahead")
    }
}
