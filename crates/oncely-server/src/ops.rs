//! Operator commands: `oncely outbox list|show|retry`.

use std::fmt::Write;

use anyhow::bail;
use oncely_outbox::store::JobFilter;
use oncely_outbox::{JobStatus, JobStore};

use crate::accounts::Accounts;
use crate::config::{JobStatusArg, OutboxCommand};
use crate::database::Database;

/// Runs an outbox command and returns what to print.
pub async fn outbox(command: OutboxCommand) -> anyhow::Result<String> {
    let database = match &command {
        OutboxCommand::List { database, .. }
        | OutboxCommand::Show { database, .. }
        | OutboxCommand::Retry { database, .. } => {
            Database::connect(&database.database_url).await?
        }
    };
    match &database {
        Database::Postgres(store) => run(&store.jobs(true), command).await,
        Database::Sqlite(store) => run(&store.jobs(true), command).await,
    }
}

async fn run<S: JobStore>(jobs: &S, command: OutboxCommand) -> anyhow::Result<String> {
    let mut out = String::new();
    match command {
        OutboxCommand::List {
            kind,
            status,
            limit,
            ..
        } => {
            let status = status.map(|s| match s {
                JobStatusArg::Pending => JobStatus::Pending,
                JobStatusArg::Sent => JobStatus::Sent,
                JobStatusArg::Dead => JobStatus::Dead,
            });
            let jobs = jobs
                .list(&JobFilter {
                    kind,
                    status,
                    limit,
                })
                .await?;
            writeln!(
                out,
                "{:>8}  {:<22} {:<8} {:>8}  {:<50}  last error",
                "id", "kind", "status", "attempts", "operation key"
            )?;
            for job in jobs {
                let status = serde_json::to_value(job.status)?
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                writeln!(
                    out,
                    "{:>8}  {:<22} {:<8} {:>8}  {:<50}  {}",
                    job.id,
                    job.kind,
                    status,
                    job.attempts,
                    job.operation_key,
                    job.last_error.unwrap_or_default()
                )?;
            }
        }
        OutboxCommand::Show { key, .. } => {
            let Some(job) = jobs.job(&key).await? else {
                bail!("no job with operation key {key:?}")
            };
            writeln!(out, "{}", serde_json::to_string_pretty(&job)?)?;
            writeln!(out, "attempts:")?;
            for attempt in jobs.attempts(job.id).await? {
                writeln!(
                    out,
                    "  #{} by {}: {} {}{}",
                    attempt.attempt,
                    attempt.worker,
                    attempt.result.as_deref().unwrap_or("running"),
                    attempt
                        .provider_message_id
                        .map(|id| format!("(provider id {id}) "))
                        .unwrap_or_default(),
                    attempt.error.unwrap_or_default()
                )?;
            }
        }
        OutboxCommand::Retry { key, .. } => {
            if !jobs.redrive(&key).await? {
                bail!("no dead job with operation key {key:?} (only dead jobs can be re-driven)");
            }
            writeln!(
                out,
                "re-driven: {key} is due now, with the same delivery key"
            )?;
        }
    }
    Ok(out)
}
