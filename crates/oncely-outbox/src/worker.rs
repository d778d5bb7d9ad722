//! The worker: claims due jobs, runs their handlers outside any transaction, records the result.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use time::OffsetDateTime;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::job::{Delivery, Job, JobStatus};
use crate::policy::RetryPolicy;
use crate::store::{Finish, JobStore, OutboxError};

/// Runs the jobs of one kind.
pub trait Handler: Send + Sync + 'static {
    /// Performs the job's effect once, forwarding [`Job::delivery_key`] to anything downstream
    /// that deduplicates, and reports what happened.
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>>;
}

/// Worker settings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Names this worker in attempt rows (host, process, random suffix by default).
    pub id: String,
    /// Jobs claimed at once (and run concurrently).
    pub batch: u32,
    /// How long a claim holds its jobs. A handler is stopped at 90 % of it (outcome unknown),
    /// so that no other worker takes the job while it still runs.
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
    /// worker claims a limited kind on its own, at most this many at a time.
    pub concurrency: Option<u32>,
}

impl Default for KindOptions {
    fn default() -> Self {
        Self {
            policy: RetryPolicy::DEFAULT,
            concurrency: None,
        }
    }
}

struct Registered {
    handler: Arc<dyn Handler>,
    options: KindOptions,
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
}

impl<S: JobStore> Worker<S> {
    /// A worker with no handlers yet.
    pub fn new(store: S, config: WorkerConfig) -> Self {
        Self {
            store,
            config,
            handlers: HashMap::new(),
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
                concurrency: None,
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
            let mut known: Vec<_> = self.handlers.keys().cloned().collect();
            known.sort();
            return Err(UnknownKind(unknown.clone(), known.join(", ")));
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

    /// The claims one batch makes: every unlimited kind together (up to the batch size), each
    /// limited kind on its own (up to its concurrency).
    fn claims(&self) -> Vec<(Vec<String>, u32)> {
        let mut unlimited = Vec::new();
        let mut claims = Vec::new();
        for (kind, registered) in &self.handlers {
            match registered.options.concurrency {
                Some(limit) => {
                    claims.push((vec![kind.clone()], limit.min(self.config.batch).max(1)))
                }
                None => unlimited.push(kind.clone()),
            }
        }
        if !unlimited.is_empty() {
            claims.push((unlimited, self.config.batch));
        }
        claims
    }

    /// The worker's settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Claims one batch of due jobs and runs it; returns how many jobs it ran.
    pub async fn run_once(&self) -> Result<usize, OutboxError> {
        let mut flight = InFlight::default();
        for (kinds, limit) in self.claims() {
            let jobs = self
                .store
                .claim(&self.config.id, &kinds, limit, self.config.lease)
                .await?;
            for job in jobs {
                flight.push(0, self.spawn(job));
            }
        }
        let ran = flight.len();
        let mut soonest = None;
        let mut failure = None;
        while !flight.is_empty() {
            if let Err(error) = self.record_next(&mut flight, &mut soonest).await {
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

    /// Runs until `shutdown` is cancelled: then it stops claiming, lets the jobs in hand finish
    /// (each handler is bounded by the lease), and returns.
    ///
    /// Jobs run continuously: whenever a claim group (the unlimited kinds, or a limited kind)
    /// has free slots, the worker claims that many more; a slow job holds its own slot only,
    /// never the next claim.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), OutboxError> {
        let mut wakeup = self.store.wakeup().await?;
        tracing::info!(worker = %self.config.id, kinds = ?self.kinds(), "outbox worker started");
        let groups = self.claims();
        let mut flight = InFlight::default();
        // A retry this worker scheduled is due before the next poll: wake for it, not later.
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            let mut free_slots = false;
            let mut claim_failed = false;
            if !shutdown.is_cancelled() {
                for (group, (kinds, limit)) in groups.iter().enumerate() {
                    let free = limit.saturating_sub(flight.running(group));
                    if free == 0 {
                        continue;
                    }
                    match self
                        .store
                        .claim(&self.config.id, kinds, free, self.config.lease)
                        .await
                    {
                        Ok(jobs) => {
                            free_slots |= (jobs.len() as u32) < free;
                            for job in jobs {
                                flight.push(group, self.spawn(job));
                            }
                        }
                        Err(error) => {
                            tracing::error!(%error, "outbox worker could not claim; retrying");
                            free_slots = true;
                            claim_failed = true;
                        }
                    }
                }
            }
            if flight.is_empty() && shutdown.is_cancelled() {
                break;
            }
            let now = tokio::time::Instant::now();
            retry_at = retry_at.filter(|at| *at > now);
            let wait = match (claim_failed, retry_at) {
                (true, _) | (false, None) => self.config.poll_interval,
                (false, Some(at)) => (at - now).min(self.config.poll_interval),
            };
            let mut soonest = None;
            if flight.is_empty() {
                // Idle: until new work is announced, a retry comes due, or the poll interval.
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = wakeup.wait(wait), if !claim_failed => {}
                    () = tokio::time::sleep(wait), if claim_failed => {}
                }
            } else if free_slots && !shutdown.is_cancelled() {
                // Busy with room to spare: a finished job, or new work, whichever comes first.
                // (Only the wait for a finished job is cancelled here, never its recording.)
                let finished = tokio::select! {
                    biased;
                    finished = flight.next() => finished,
                    () = shutdown.cancelled() => None,
                    () = wakeup.wait(wait) => None,
                };
                if let Some(first) = finished
                    && let Err(error) = self.record_with(first, &mut flight, &mut soonest).await
                {
                    tracing::error!(%error, "outbox attempts not recorded; they run again when their lease ends");
                }
            } else if let Err(error) = self.record_next(&mut flight, &mut soonest).await {
                tracing::error!(%error, "outbox attempts not recorded; they run again when their lease ends");
            }
            if let Some(delay) = soonest {
                let at = tokio::time::Instant::now() + delay;
                retry_at = Some(retry_at.map_or(at, |r| r.min(at)));
            }
        }
        tracing::info!(worker = %self.config.id, "outbox worker stopped");
        Ok(())
    }

    /// Starts one job in a task of its own.
    fn spawn(&self, job: Job) -> JoinHandle<(Job, Option<Finish>)> {
        let registered = self
            .handlers
            .get(&job.kind)
            .map(|r| (r.handler.clone(), r.options));
        let store = self.store.clone();
        let limit = self.config.lease.mul_f64(0.9);
        tokio::spawn(attempt(registered, store, limit, job).in_current_span())
    }

    /// Waits for the next job to finish and records it with every other one finished by then
    /// (see [`Worker::record_with`]).
    async fn record_next(
        &self,
        flight: &mut InFlight,
        soonest: &mut Option<Duration>,
    ) -> Result<(), OutboxError> {
        match flight.next().await {
            Some(first) => self.record_with(first, flight, soonest).await,
            None => Ok(()),
        }
    }

    /// Records `first` and every other job finished by now in one statement; `soonest` keeps
    /// the earliest retry scheduled.
    async fn record_with(
        &self,
        first: (Job, Option<Finish>),
        flight: &mut InFlight,
        soonest: &mut Option<Duration>,
    ) -> Result<(), OutboxError> {
        let mut done = vec![first];
        while let Some(Some(more)) = flight.next().now_or_never() {
            done.push(more);
        }
        let finished: Vec<(&Job, &Finish)> = done
            .iter()
            .filter_map(|(job, finish)| Some((job, finish.as_ref()?)))
            .collect();
        if finished.is_empty() {
            return Ok(());
        }
        let owned = self.finish_with_retries(&finished).await?;
        for ((job, finish), owned) in finished.into_iter().zip(owned) {
            if !owned {
                tracing::warn!(
                    job = job.id,
                    "outbox lease lost before the attempt was recorded"
                );
            } else if finish.status == JobStatus::Pending {
                *soonest = Some(soonest.map_or(finish.retry_in, |s| s.min(finish.retry_in)));
            }
        }
        Ok(())
    }
}

impl<S: JobStore> Worker<S> {
    /// Records finished attempts. A failed write (a database blip) is retried with backoff for
    /// up to a lease: the attempts already happened, and a result that is never recorded makes
    /// the job run — the email be sent — again after its lease. Every write is fenced by the
    /// claim's lease token, so a late one cannot overwrite another worker's claim (it reports
    /// the lease as lost instead).
    async fn finish_with_retries(
        &self,
        finished: &[(&Job, &Finish)],
    ) -> Result<Vec<bool>, OutboxError> {
        let deadline = tokio::time::Instant::now() + self.config.lease;
        let mut delay = FINISH_RETRY_FIRST;
        loop {
            match self.store.finish_all(finished).await {
                Ok(owned) => return Ok(owned),
                Err(error) if tokio::time::Instant::now() + delay < deadline => {
                    tracing::warn!(%error, retry_in = ?delay, jobs = finished.len(), "recording outbox attempts failed; retrying");
                    metrics::counter!("oncely_outbox_finish_retries_total").increment(1);
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(FINISH_RETRY_MAX);
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// First and longest pause between tries to record finished attempts.
const FINISH_RETRY_FIRST: Duration = Duration::from_millis(50);
const FINISH_RETRY_MAX: Duration = Duration::from_secs(2);

/// The jobs a worker is running, each in its own task, with a count per claim group.
#[derive(Default)]
struct InFlight {
    tasks: FuturesUnordered<Tagged>,
    per_group: HashMap<usize, u32>,
}

/// A running job's task and its claim group.
type Tagged = Pin<Box<dyn Future<Output = (usize, Option<(Job, Option<Finish>)>)> + Send>>;

impl InFlight {
    fn push(&mut self, group: usize, task: JoinHandle<(Job, Option<Finish>)>) {
        *self.per_group.entry(group).or_default() += 1;
        self.tasks
            .push(Box::pin(async move { (group, task.await.ok()) }));
    }

    fn running(&self, group: usize) -> u32 {
        self.per_group.get(&group).copied().unwrap_or(0)
    }

    fn len(&self) -> usize {
        self.tasks.len()
    }

    fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The next finished job (`None` once nothing runs). A task that failed outright (it cannot:
    /// panics are caught in [`attempt`]) leaves its job to run again when its lease ends.
    async fn next(&mut self) -> Option<(Job, Option<Finish>)> {
        loop {
            let (group, result) = self.tasks.next().await?;
            if let Some(count) = self.per_group.get_mut(&group) {
                *count -= 1;
            }
            match result {
                Some(done) => return Some(done),
                None => tracing::error!(
                    "an outbox job's task failed; it runs again when its lease ends"
                ),
            }
        }
    }
}

/// Runs one job; returns what to record of it (`None`: handed back unstarted). A handler that
/// panics or outlives `limit` is an unknown outcome, retried with the same delivery key.
async fn attempt<S: JobStore>(
    registered: Option<(Arc<dyn Handler>, KindOptions)>,
    store: S,
    limit: Duration,
    job: Job,
) -> (Job, Option<Finish>) {
    let Some((handler, options)) = registered else {
        // Claims only ask for registered kinds; keep the job for a worker that has it.
        if let Err(error) = store.release(&job).await {
            tracing::warn!(job = job.id, %error, "could not hand a job back; it is due again when its lease ends");
        }
        return (job, None);
    };
    let now = OffsetDateTime::now_utc();
    let finish = if job.not_after.is_some_and(|deadline| deadline <= now) {
        Finish {
            status: JobStatus::Dead,
            result: "expired",
            retry_in: Duration::ZERO,
            provider_message_id: None,
            error: Some("not run: its deadline passed before delivery".into()),
        }
    } else {
        let run = std::panic::AssertUnwindSafe(handler.run(&job)).catch_unwind();
        let delivery = match tokio::time::timeout(limit, run).await {
            Ok(Ok(delivery)) => delivery,
            Ok(Err(_)) => Delivery::Unknown("the handler panicked".into()),
            Err(_) => Delivery::Unknown(format!("the handler took longer than {limit:?}")),
        };
        decide(&job, delivery, &options.policy, now)
    };
    metrics::counter!("oncely_outbox_attempts_total", "kind" => job.kind.clone(), "result" => finish.result)
        .increment(1);
    let level_ok = finish.status != JobStatus::Dead || finish.result == "skipped";
    if level_ok {
        tracing::info!(job = job.id, kind = %job.kind, attempt = job.attempt, result = finish.result, error = finish.error.as_deref(), "outbox attempt");
    } else {
        tracing::warn!(job = job.id, kind = %job.kind, attempt = job.attempt, result = finish.result, error = finish.error.as_deref(), "outbox job is dead");
    }
    (job, Some(finish))
}

/// What to record for an attempt's outcome, under `policy`.
pub fn decide(job: &Job, delivery: Delivery, policy: &RetryPolicy, now: OffsetDateTime) -> Finish {
    let (result, error) = match delivery {
        Delivery::Sent {
            provider_message_id,
        } => {
            return Finish {
                status: JobStatus::Sent,
                result: "sent",
                retry_in: Duration::ZERO,
                provider_message_id,
                error: None,
            };
        }
        Delivery::Permanent(error) => {
            return Finish {
                status: JobStatus::Dead,
                result: "dead",
                retry_in: Duration::ZERO,
                provider_message_id: None,
                error: Some(error),
            };
        }
        Delivery::Skipped(reason) => {
            return Finish {
                status: JobStatus::Dead,
                result: "skipped",
                retry_in: Duration::ZERO,
                provider_message_id: None,
                error: Some(reason),
            };
        }
        Delivery::Retry(error) => ("retry", error),
        Delivery::Unknown(error) => ("unknown", error),
    };
    let retry_in = policy.delay(job.attempt);
    let age = (now - job.created_at).try_into().unwrap_or(Duration::ZERO);
    let dead = |why: String| Finish {
        status: JobStatus::Dead,
        result,
        retry_in: Duration::ZERO,
        provider_message_id: None,
        error: Some(why),
    };
    if job.attempt >= policy.max_attempts {
        return dead(format!("gave up after {} attempts: {error}", job.attempt));
    }
    if age + retry_in > policy.horizon {
        return dead(format!(
            "gave up: the next try would fall after the {:?} retry horizon: {error}",
            policy.horizon
        ));
    }
    Finish {
        status: JobStatus::Pending,
        result,
        retry_in,
        provider_message_id: None,
        error: Some(error),
    }
}
