//! The worker, in river's three parts: the producer (`producer.rs`) claims due jobs and keeps
//! every slot busy (wake-ups, polling, concurrency per kind), the executor (`executor.rs`) runs
//! one attempt outside any transaction and asks the kind's [`RetryPolicy`] what it means, the
//! completer (`completer.rs`) records the results in batches; `holds.rs` keeps what the worker
//! holds back per kind (a throttled kind until its `Retry-After`, a paused kind — its
//! credentials refused — but for one probe per interval). This module holds what ties them:
//! handlers, settings, the [`Worker`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::job::{
    DeliveryFuture, Ended, FreezeFuture, Job, PointOfNoReturn, ReconcileFuture, Reconciled,
    ThenFuture,
};
use crate::policy::RetryPolicy;
use crate::store::{JobStore, OutboxError};

mod backoff;
mod completer;
mod executor;
mod holds;
mod producer;
mod reconciler;

pub use reconciler::Reconciliation;

/// Runs the jobs of one kind.
pub trait Handler: Send + Sync + 'static {
    /// Performs the job's effect once, forwarding [`Job::delivery_key`] to anything downstream
    /// that deduplicates, and reports what happened. What it sends should be what
    /// [`Job::frozen`] says, when the handler freezes ([`Handler::freeze`]).
    fn run<'a>(&'a self, job: &'a Job) -> DeliveryFuture<'a>;

    /// Whether [`Handler::run_marked`] records the attempt's point of no return — calls
    /// [`PointOfNoReturn::reached`] before anything of the job's effect can reach the other
    /// side, waits for it, and does nothing that could reach it if it fails — on every path that
    /// can reach it. The worker asks once per claim: for a kind that reconciles
    /// ([`OnUnknown::Reconcile`](crate::OnUnknown)) and whose handler says so, an attempt its
    /// worker abandoned before that moment is retried as any retry instead of parked (nothing
    /// was handed over). The default: it does not (an abandoned attempt may have reached the
    /// provider at any moment: parked). [`EmailHandler`](crate::mail::EmailHandler) answers
    /// for its mailer ([`Mailer::marks_point_of_no_return`](crate::mail::Mailer)).
    fn marks_point_of_no_return(&self) -> bool {
        false
    }

    /// [`Handler::run`], told where to record its point of no return: a handler that says it
    /// records it ([`Handler::marks_point_of_no_return`]) calls `mark` just before its effect's
    /// data is handed over (a mailer: [`Mailer::send_marked`](crate::mail::Mailer)), and hands
    /// nothing over if it fails. The default runs [`Handler::run`] and records nothing.
    fn run_marked<'a>(&'a self, job: &'a Job, mark: &'a dyn PointOfNoReturn) -> DeliveryFuture<'a> {
        let _ = mark;
        self.run(job)
    }

    /// What this job would send if it ran now, read from current state: the parts of the
    /// payload that must not change between attempts under the job's delivery key — a
    /// recipient, a sender, a link's base, a rendered template — because a provider that
    /// deduplicates by key refuses another payload under a key it has seen (Resend: 409
    /// `invalid_idempotent_request`, until the job is dead) or drops it silently.
    ///
    /// The worker asks before an attempt whose job has no frozen value yet, stores the answer
    /// on the job *before* [`Handler::run`] (once: the first answer stored wins; and only while
    /// the attempt's claim owns the job), and hands it to this and every later attempt as
    /// [`Job::frozen`]: a retry after an unknown outcome sends exactly what the first attempt
    /// may have sent, whatever changed since. Checks that decide *whether* to send (the link
    /// was used, the account is gone) belong in `run`, which runs them on every attempt.
    ///
    /// `Ok(None)` (the default): nothing to freeze, `run` gets `frozen: None`. `Err(outcome)`:
    /// the attempt ends with `outcome` (`Skipped`, `Permanent`, `Retry`…) without running. The
    /// value is stored in plaintext in the outbox table: freeze what renders a secret (a token's
    /// id and the link's base), never the secret itself.
    fn freeze<'a>(&'a self, job: &'a Job) -> FreezeFuture<'a> {
        let _ = job;
        Box::pin(std::future::ready(Ok(None)))
    }

    /// The follow-up jobs of `job`, which is about to end as `end` says (sent, dead — expired or
    /// past its horizon included — or skipped): an `email.sent` event for a sent email, say.
    /// They are written *in the same write* as the final status, only if that write still owns
    /// the job (its lease token, like the finish), each unless its operation key exists (so a
    /// finish recorded twice never doubles them; the keys are the handler's business — name
    /// them after the job and the end), and idle workers of their kinds are woken as for any
    /// enqueue. Asked once per final status: never for a retry; again when a re-driven job ends
    /// anew (name its follow-ups so that they differ, if they should).
    ///
    /// `Err` (it may read a database that is down, or meet a connection the server ended) is
    /// asked again, with backoff from 50 ms to 2 s, until the lease's last 5 %: a blip or one
    /// dead connection costs a moment, not a second delivery. If it still fails then (or
    /// panics, or does not answer in time), nothing is lost — the final status is *not*
    /// recorded without its follow-ups. The job stays pending instead, its attempt recorded as
    /// `unknown` spending no attempt of the budget, and is retried after the policy's first
    /// delay under the same delivery key (and frozen payload): the handler runs again — a
    /// provider that deduplicates by the key does not deliver twice; one that does not (plain
    /// SMTP) may — and `then` is asked again when it ends.
    ///
    /// The default: no follow-ups.
    fn then<'a>(&'a self, job: &'a Job, end: &'a Ended) -> ThenFuture<'a> {
        let _ = (job, end);
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Whether [`Handler::reconcile`] can ask the provider about a job. A worker looks at the
    /// parked jobs ([`JobStatus::Unknown`](crate::JobStatus)) of a kind that reconciles
    /// ([`OnUnknown::Reconcile`](crate::OnUnknown)) only if its handler can; otherwise they wait
    /// for an operator (`oncely outbox settle`). The default: it cannot.
    fn reconciles(&self) -> bool {
        false
    }

    /// Asks the provider whether it accepted a message under `job`'s delivery key (the job was
    /// parked: an attempt may or may not have reached it). The worker settles the job by the
    /// answer ([`Reconciled`]): as sent, for resending, or asks again later. Bounded by 90 % of
    /// the worker's lease (no answer by then: [`Reconciled::Unknown`]); a panic is an
    /// `Unknown` too. Asked only when [`Handler::reconciles`] says it can.
    fn reconcile<'a>(&'a self, job: &'a Job) -> ReconcileFuture<'a> {
        let _ = job;
        Box::pin(std::future::ready(Reconciled::Unknown(
            "this handler cannot ask its provider".to_owned(),
        )))
    }
}

/// Worker settings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Names this worker in attempt rows (host, process, random suffix by default).
    pub id: String,
    /// Jobs claimed at once (and run concurrently).
    pub batch: u32,
    /// How long a claim holds its jobs. The lease starts when the database runs the claim,
    /// and a handler is stopped (outcome unknown) at 90 % of it counted from *before* the claim
    /// was sent: a claim that waited (for a lock, a busy database, the network) shortens the
    /// time its jobs get, never lets their lease run out while they still run, so no other
    /// worker takes a job while it runs here.
    pub lease: Duration,
    /// How often an idle worker looks for due jobs without a wake-up (retries come due this way).
    pub poll_interval: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into());
        Self {
            id: format!(
                "{host}-{}-{:04x}",
                std::process::id(),
                rand::random::<u16>()
            ),
            batch: 16,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// How one kind of job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindOptions {
    /// Its retry policy.
    pub policy: RetryPolicy,
    /// At most this many of its jobs at once in one worker (`None`: up to the batch size). A
    /// worker claims a limited kind on its own, at most this many at a time: these are the
    /// kind's own slots, and may be more than the batch size (a kind of slow calls — webhooks —
    /// needs many at once, none of them taken from the other kinds).
    pub concurrency: Option<u32>,
    /// While the kind is paused — an attempt reported [`Delivery::Refused`](crate::Delivery):
    /// the provider refused our credentials or configuration — the worker claims one probe job
    /// of it per this interval and no other; the first outcome that is not a refusal resumes
    /// the kind. 30 s by default.
    pub probe_interval: Duration,
    /// At most this many of its jobs *of one partition* ([`NewJob::partition`](crate::NewJob))
    /// at once in one worker (`None`: no such limit). Per worker, like `concurrency`: `n`
    /// workers run up to `n` times this many of a partition. A partition at its limit (its jobs
    /// run slowly: an endpoint that times out) never keeps the kind's other partitions waiting:
    /// the worker claims such a kind on its own, partition by partition, each up to its room
    /// ([`JobStore::claim_partitioned`]). Jobs without a partition have only the kind's limits;
    /// `concurrency` still bounds the whole kind (the batch size when `None`).
    pub per_partition: Option<u32>,
    /// What an unknown outcome leads to ([`OnUnknown`](crate::OnUnknown)): a resend under the
    /// same delivery key (the default), or a parked job that waits to be settled.
    pub on_unknown: crate::OnUnknown,
    /// Under [`OnUnknown::Reconcile`](crate::OnUnknown), a provider's answer that it has *not*
    /// accepted a parked job ([`Reconciled::NotAccepted`]) is believed only once the job has
    /// been parked this long (by the store's clock): a message still in the provider's hands
    /// when the attempt gave up — its answer slow, not lost — may be accepted after, and a
    /// resend before then would be a second copy. 10 minutes by default: the longest an SMTP
    /// client waits for the answer to a message's data (RFC 5321, 4.5.3.2.6). An answer that it
    /// *has* accepted is believed at once.
    pub reconcile_grace: Duration,
}

impl KindOptions {
    /// The default [`KindOptions::probe_interval`].
    pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(30);
    /// The default [`KindOptions::reconcile_grace`].
    pub const DEFAULT_RECONCILE_GRACE: Duration = Duration::from_secs(600);
}

impl Default for KindOptions {
    fn default() -> Self {
        Self {
            policy: RetryPolicy::DEFAULT,
            concurrency: None,
            probe_interval: Self::DEFAULT_PROBE_INTERVAL,
            per_partition: None,
            on_unknown: crate::OnUnknown::Resend,
            reconcile_grace: Self::DEFAULT_RECONCILE_GRACE,
        }
    }
}

/// A kind's handler and options.
#[derive(Clone)]
struct Registered {
    handler: Arc<dyn Handler>,
    options: KindOptions,
}

impl Registered {
    /// Whether this kind's attempts record their point of no return: its handler can
    /// ([`Handler::marks_point_of_no_return`]) and the kind reconciles — the mark decides only
    /// whether an abandoned attempt parks, which a kind that resends never does, so it costs
    /// such a kind nothing. The claim arms these attempts (`ahead`) and the executor hands these
    /// handlers the mark that records it: both ask here, so they always agree.
    fn marks(&self) -> bool {
        self.options.on_unknown == crate::OnUnknown::Reconcile
            && self.handler.marks_point_of_no_return()
    }
}

/// `restrict_to` named a kind this worker has no handler for.
#[derive(Debug, thiserror::Error)]
#[error("no handler for job kind {0:?} (known: {1})")]
pub struct UnknownKind(pub String, pub String);

/// Runs registered kinds of jobs from a [`JobStore`]. Any number of workers, in any number of
/// processes, coordinate only through the database.
pub struct Worker<S> {
    store: S,
    config: WorkerConfig,
    handlers: HashMap<String, Registered>,
    /// Kinds held back: throttled, or paused (see `holds.rs`); shared with the attempts' tasks,
    /// which note acceptances as they happen.
    holds: Arc<Mutex<holds::Holds>>,
}

impl<S: JobStore> Worker<S> {
    /// A worker with no handlers yet.
    pub fn new(store: S, config: WorkerConfig) -> Self {
        Self {
            store,
            config,
            handlers: HashMap::new(),
            holds: Arc::default(),
        }
    }

    /// Runs jobs of `kind` with `handler`, the default retry policy and no concurrency limit.
    pub fn handle(self, kind: &str, handler: impl Handler) -> Self {
        self.handle_with(kind, handler, KindOptions::default())
    }

    /// Runs jobs of `kind` with `handler` and `policy`.
    pub fn handle_with_policy(
        self,
        kind: &str,
        handler: impl Handler,
        policy: RetryPolicy,
    ) -> Self {
        self.handle_with(
            kind,
            handler,
            KindOptions {
                policy,
                ..KindOptions::default()
            },
        )
    }

    /// Runs jobs of `kind` with `handler` and `options`.
    pub fn handle_with(mut self, kind: &str, handler: impl Handler, options: KindOptions) -> Self {
        self.handlers.insert(
            kind.to_owned(),
            Registered {
                handler: Arc::new(handler),
                options,
            },
        );
        self
    }

    /// Keeps only the handlers of `kinds` (`oncely worker --kinds …`): this worker leaves every
    /// other kind to other workers.
    pub fn restrict_to(mut self, kinds: &[String]) -> Result<Self, UnknownKind> {
        if let Some(unknown) = kinds.iter().find(|k| !self.handlers.contains_key(*k)) {
            return Err(UnknownKind(unknown.clone(), self.kinds().join(", ")));
        }
        self.handlers.retain(|kind, _| kinds.contains(kind));
        Ok(self)
    }

    /// The kinds this worker runs.
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<_> = self.handlers.keys().cloned().collect();
        kinds.sort();
        kinds
    }

    /// The worker's settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// The kinds held back (a poisoned lock still holds valid holds: each change is one
    /// statement).
    fn holds(&self) -> MutexGuard<'_, holds::Holds> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims one batch of due jobs and runs it; returns how many jobs it ran. Kinds this
    /// worker holds back are not claimed (a paused kind's probe is, when due).
    pub async fn run_once(&self) -> Result<usize, OutboxError> {
        let mut flight = producer::InFlight::default();
        let mut failure = None;
        for (group, claim) in self.claim_groups().iter().enumerate() {
            let deadline = self.deadline();
            let (jobs, claimed) = self.claim_kinds(claim, claim.limit, HashMap::new()).await;
            for job in jobs {
                flight.push(group, job.partition.clone(), self.spawn(job, deadline));
            }
            if let Err(error) = claimed {
                failure = Some(error);
                break;
            }
        }
        let ran = flight.len();
        while !flight.is_empty() {
            if let Err(error) = self.record_next(&mut flight).await {
                failure.get_or_insert(error);
            }
        }
        failure.map_or(Ok(ran), Err)
    }

    /// Runs batches until nothing is due now (jobs waiting for a retry delay stay pending).
    pub async fn drain(&self) -> Result<usize, OutboxError> {
        let mut total = 0;
        loop {
            let n = self.run_once().await?;
            if n == 0 {
                return Ok(total);
            }
            total += n;
        }
    }
}
