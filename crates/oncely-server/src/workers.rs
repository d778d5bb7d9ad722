//! Outbox workers of the service: which job kinds they run, and how they are started and
//! supervised.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use oncely_outbox::{KindOptions, OnUnknown, OutboxError, RetryPolicy, Worker, WorkerConfig};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::accounts::Accounts;
use crate::mail::{
    EMAIL_CHANGE_NOTICE, EMAIL_TAKEN_NOTICE, Emailing, MailContext, Notice, NoticeEmail,
    SIGNUP_NOTICE, TokenEmail,
};
use crate::token::Flow;
use crate::webhooks::delivery::{
    WEBHOOK_CONCURRENCY, WEBHOOK_PER_ENDPOINT, WebhookDelivery, WebhookSettings,
};
use crate::webhooks::events::WEBHOOK_KIND;

/// A worker for every email kind of the service.
pub fn email_worker<A: Accounts>(
    accounts: &A,
    jobs: A::Jobs,
    context: Arc<MailContext>,
    config: WorkerConfig,
    options: KindOptions,
) -> Worker<A::Jobs> {
    let mut worker = Worker::new(jobs, config);
    for flow in [
        Flow::Verification,
        Flow::PasswordReset,
        Flow::MagicLink,
        Flow::Invite,
        Flow::EmailChange,
    ] {
        let handler = Emailing(TokenEmail {
            accounts: accounts.clone(),
            context: context.clone(),
        });
        worker = worker.handle_with(flow.job_kind(), handler, options);
    }
    let notices = [
        (SIGNUP_NOTICE, Notice::SignupAttempt),
        (EMAIL_CHANGE_NOTICE, Notice::ChangeRequested),
        (EMAIL_TAKEN_NOTICE, Notice::AddressTaken),
    ];
    for (kind, notice) in notices {
        let handler = Emailing(NoticeEmail {
            accounts: accounts.clone(),
            context: context.clone(),
            notice,
        });
        worker = worker.handle_with(kind, handler, options);
    }
    worker
}

/// How the `webhook` kind runs: the email kinds' retry policy, resent after an unknown outcome
/// (receivers deduplicate by the event's id; [`OnUnknown::Resend`]), a concurrency of its own
/// ([`WEBHOOK_CONCURRENCY`]: the worker claims webhook jobs on their own, so slow endpoints
/// never take the email kinds' slots), and at most [`WEBHOOK_PER_ENDPOINT`] deliveries to one
/// endpoint at once (its partition), so one slow endpoint never takes the others' slots.
pub fn webhook_options(email: KindOptions) -> KindOptions {
    KindOptions {
        concurrency: Some(WEBHOOK_CONCURRENCY),
        per_partition: Some(WEBHOOK_PER_ENDPOINT),
        on_unknown: OnUnknown::Resend,
        ..email
    }
}

/// `worker` with the `webhook` kind handled by `delivery` ([`webhook_options`]).
pub fn with_webhooks<A: Accounts>(
    worker: Worker<A::Jobs>,
    delivery: WebhookDelivery<A>,
    email: KindOptions,
) -> Worker<A::Jobs> {
    worker.handle_with(WEBHOOK_KIND, delivery, webhook_options(email))
}

/// The running workers of a process: each a supervisor that runs one worker and restarts it
/// ([`supervise`]). Each ends once the shutdown token is cancelled and its worker finished the
/// jobs in hand.
pub type WorkerHandles = Vec<JoinHandle<()>>;

/// The first pause before a worker that stopped unexpectedly is started again.
pub const RESTART_FIRST: Duration = Duration::from_secs(1);

/// The longest pause before a worker that stopped unexpectedly is started again (the pause
/// doubles from [`RESTART_FIRST`] while restarts follow each other).
pub const RESTART_MAX: Duration = Duration::from_secs(60);

/// A worker that ran this long before it stopped starts again after [`RESTART_FIRST`].
const RESTART_RESET_AFTER: Duration = Duration::from_secs(120);

/// Runs the worker `start` makes, in a task of its own, until `shutdown` is cancelled and it
/// returned. A worker that returns an error, returns early or panics while the process is not
/// shutting down is logged at error level, counted (`oncely_outbox_worker_restarts_total`) and
/// started again (by calling `start` anew) after a pause of [`RESTART_FIRST`], doubling to
/// [`RESTART_MAX`]. The jobs it had in hand run again when their lease ends.
///
/// Both `serve` and `oncely worker` restart rather than exit: the other workers of the process
/// (and, in `serve`, the API) keep running, and a worker that keeps failing says so in the log
/// and the metric at every restart.
pub fn supervise<F, Fut>(name: String, shutdown: CancellationToken, mut start: F) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), OutboxError>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut pause = RESTART_FIRST;
        loop {
            let started = Instant::now();
            let stopped = match tokio::spawn(start()).await {
                Ok(Ok(())) if shutdown.is_cancelled() => return,
                Ok(Ok(())) => "it returned before shutdown".to_owned(),
                Ok(Err(error)) => format!("it failed: {error}"),
                Err(join) => match join.try_into_panic() {
                    Ok(panic) => format!("it panicked: {}", panic_message(panic.as_ref())),
                    Err(_) => "its task was cancelled".to_owned(),
                },
            };
            if shutdown.is_cancelled() {
                tracing::error!(worker = %name, reason = %stopped, "outbox worker stopped while shutting down");
                return;
            }
            if started.elapsed() >= RESTART_RESET_AFTER {
                pause = RESTART_FIRST;
            }
            tracing::error!(worker = %name, reason = %stopped, restart_in = ?pause, "outbox worker stopped unexpectedly; restarting it");
            metrics::counter!("oncely_outbox_worker_restarts_total").increment(1);
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(RESTART_MAX);
        }
    })
}

/// What a panic said, when it said it with a string.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// How many workers to run, and how.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    /// Workers in this process.
    pub count: usize,
    /// Their settings (each gets `-<n>` appended to its id).
    pub config: WorkerConfig,
    /// How every email kind runs: its retry policy, and how often a paused kind (the provider
    /// refused our credentials) is probed.
    pub options: KindOptions,
    /// Only these kinds; empty: all.
    pub kinds: Vec<String>,
    /// What webhook deliveries may reach, and their timeout.
    pub webhooks: WebhookSettings,
}

impl WorkerPlan {
    /// `count` workers of `kinds` (empty: all) holding a job for `lease`, first retrying an
    /// email after `retry_base`, probing a paused kind every `probe_interval`.
    pub fn new(
        count: usize,
        lease: Duration,
        (retry_base, probe_interval): (Duration, Duration),
        kinds: Vec<String>,
    ) -> Self {
        Self {
            count,
            config: WorkerConfig {
                lease,
                ..WorkerConfig::default()
            },
            options: KindOptions {
                policy: RetryPolicy {
                    base: retry_base,
                    ..RetryPolicy::DEFAULT
                },
                concurrency: None,
                probe_interval,
                per_partition: None,
                on_unknown: OnUnknown::default(),
                reconcile_grace: KindOptions::DEFAULT_RECONCILE_GRACE,
            },
            kinds,
            webhooks: WebhookSettings::development(),
        }
    }
}

/// Starts the planned workers, each supervised ([`supervise`]: restarted if it fails or
/// panics); they run until `shutdown` is cancelled. An unknown kind in the plan is an error
/// before anything starts.
pub fn spawn<A: Accounts>(
    accounts: &A,
    jobs: &A::Jobs,
    context: &Arc<MailContext>,
    plan: &WorkerPlan,
    shutdown: &CancellationToken,
) -> anyhow::Result<WorkerHandles> {
    let mut handles = Vec::new();
    // One client for every worker of the process.
    let delivery = WebhookDelivery::new(accounts.clone(), context.secret.clone(), plan.webhooks)?;
    for i in 0..plan.count {
        let config = WorkerConfig {
            id: format!("{}-{i}", plan.config.id),
            ..plan.config.clone()
        };
        let make = {
            let (accounts, jobs, context, kinds, delivery) = (
                accounts.clone(),
                jobs.clone(),
                context.clone(),
                plan.kinds.clone(),
                delivery.clone(),
            );
            let (config, options) = (config.clone(), plan.options);
            move || {
                let worker = with_webhooks(
                    email_worker(
                        &accounts,
                        jobs.clone(),
                        context.clone(),
                        config.clone(),
                        options,
                    ),
                    delivery.clone(),
                    options,
                );
                if kinds.is_empty() {
                    Ok(worker)
                } else {
                    worker.restrict_to(&kinds)
                }
            }
        };
        // An unknown kind stops start-up, before any worker runs.
        make()?;
        let shutdown_worker = shutdown.clone();
        handles.push(supervise(config.id, shutdown.clone(), move || {
            let worker = make().expect("the kinds were checked at start-up");
            worker.run(shutdown_worker.clone())
        }));
    }
    Ok(handles)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    /// Regression (issue 14, item 6): a worker task that failed or panicked was gone for good
    /// (its handle held the error until shutdown); the process went on without it, silently.
    #[tokio::test(start_paused = true)]
    async fn a_worker_that_panics_or_fails_is_restarted_and_counted_until_shutdown() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _recording = metrics::set_default_local_recorder(&recorder);
        let shutdown = CancellationToken::new();
        let starts = Arc::new(AtomicU32::new(0));
        let supervisor = supervise("w-0".into(), shutdown.clone(), {
            let (starts, shutdown) = (starts.clone(), shutdown.clone());
            move || {
                let start = starts.fetch_add(1, SeqCst);
                let shutdown = shutdown.clone();
                async move {
                    match start {
                        0 => panic!("a bug in the worker"),
                        1 => Err(OutboxError::Database(sqlx::Error::PoolTimedOut)),
                        _ => {
                            shutdown.cancelled().await;
                            Ok(())
                        }
                    }
                }
            }
        });
        // Paused time: the pauses before each restart pass as soon as nothing else runs.
        while starts.load(SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        shutdown.cancel();
        supervisor.await.unwrap();
        assert_eq!(starts.load(SeqCst), 3, "not started again after shutdown");
        let restarts: Vec<_> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == "oncely_outbox_worker_restarts_total")
            .map(|(.., value)| value)
            .collect();
        assert_eq!(restarts, [DebugValue::Counter(2)]);
    }
}
