//! Outbox workers of the service: which job kinds they run, and how they are started.

use std::sync::Arc;

use oncely_outbox::{OutboxError, RetryPolicy, Worker, WorkerConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::accounts::Accounts;
use crate::mail::{MailContext, SIGNUP_NOTICE, SignupNotice, TokenEmail};
use crate::token::Flow;

/// A worker for every email kind of the service.
pub fn worker<A: Accounts>(
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

/// Starts `n` workers that run until `shutdown` is cancelled.
pub fn spawn<A: Accounts>(
    accounts: &A,
    jobs: &A::Jobs,
    context: &Arc<MailContext>,
    n: usize,
    config: &WorkerConfig,
    policy: RetryPolicy,
    shutdown: &CancellationToken,
) -> Vec<JoinHandle<Result<(), OutboxError>>> {
    (0..n)
        .map(|i| {
            let config = WorkerConfig {
                id: format!("{}-{i}", config.id),
                ..config.clone()
            };
            let worker = worker(accounts, jobs.clone(), context.clone(), config, policy);
            tokio::spawn(worker.run(shutdown.clone()))
        })
        .collect()
}
