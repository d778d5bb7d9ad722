//! Outbox workers of the service: which job kinds they run, and how they are started.

use std::sync::Arc;
use std::time::Duration;

use oncely_outbox::{OutboxError, RetryPolicy, Worker, WorkerConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::accounts::Accounts;
use crate::mail::{MailContext, SIGNUP_NOTICE, SignupNotice, TokenEmail};
use crate::token::Flow;

/// A worker for every email kind of the service.
pub fn email_worker<A: Accounts>(
    accounts: &A,
    jobs: A::Jobs,
    context: Arc<MailContext>,
    config: WorkerConfig,
    policy: RetryPolicy,
) -> Worker<A::Jobs> {
    let mut worker = Worker::new(jobs, config);
    for flow in [
        Flow::Verification,
        Flow::PasswordReset,
        Flow::MagicLink,
        Flow::Invite,
    ] {
        let handler = TokenEmail {
            accounts: accounts.clone(),
            context: context.clone(),
        };
        worker = worker.handle_with_policy(flow.job_kind(), handler, policy);
    }
    let notice = SignupNotice {
        accounts: accounts.clone(),
        context,
    };
    worker.handle_with_policy(SIGNUP_NOTICE, notice, policy)
}

/// The running workers of a process.
pub type WorkerHandles = Vec<JoinHandle<Result<(), OutboxError>>>;

/// How many workers to run, and how.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    /// Workers in this process.
    pub count: usize,
    /// Their settings (each gets `-<n>` appended to its id).
    pub config: WorkerConfig,
    /// The retry policy of every email kind.
    pub policy: RetryPolicy,
    /// Only these kinds; empty: all.
    pub kinds: Vec<String>,
}

impl WorkerPlan {
    /// `count` workers of `kinds` (empty: all) holding a job for `lease`, first retrying an
    /// email after `retry_base`.
    pub fn new(count: usize, lease: Duration, retry_base: Duration, kinds: Vec<String>) -> Self {
        Self {
            count,
            config: WorkerConfig {
                lease,
                ..WorkerConfig::default()
            },
            policy: RetryPolicy {
                base: retry_base,
                ..RetryPolicy::DEFAULT
            },
            kinds,
        }
    }
}

/// Starts the planned workers; they run until `shutdown` is cancelled. An unknown kind in the
/// plan is an error before anything starts.
pub fn spawn<A: Accounts>(
    accounts: &A,
    jobs: &A::Jobs,
    context: &Arc<MailContext>,
    plan: &WorkerPlan,
    shutdown: &CancellationToken,
) -> anyhow::Result<WorkerHandles> {
    let mut handles = Vec::new();
    for i in 0..plan.count {
        let config = WorkerConfig {
            id: format!("{}-{i}", plan.config.id),
            ..plan.config.clone()
        };
        let mut worker = email_worker(accounts, jobs.clone(), context.clone(), config, plan.policy);
        if !plan.kinds.is_empty() {
            worker = worker.restrict_to(&plan.kinds)?;
        }
        handles.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    Ok(handles)
}
