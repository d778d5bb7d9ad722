//! Operator commands: `oncely outbox list|show|retry`, `oncely key show`.

use std::fmt::Write;

use anyhow::bail;
use oncely_outbox::store::{DeadFilter, JobFilter, PROVIDER_DEDUPE_WINDOW};
use oncely_outbox::{JobStatus, JobStore};

use crate::accounts::{AccountError, Accounts};
use crate::backend::{Backend, COMMAND_POOL};
use crate::cli::{JobStatusArg, KeyCommand, OutboxCommand};

/// Runs an outbox command on backend `B` and returns what to print.
pub async fn outbox<B: Backend>(command: OutboxCommand) -> anyhow::Result<String> {
    // `dead` is `list --status dead`.
    let command = match command {
        OutboxCommand::Dead {
            kind,
            limit,
            database,
        } => OutboxCommand::List {
            kind,
            status: Some(JobStatusArg::Dead),
            limit,
            database,
        },
        other => other,
    };
    let backend = B::connect(&command.database().database_url, COMMAND_POOL).await?;
    run_outbox_command(&backend.jobs(true), command).await
}

async fn run_outbox_command<S: JobStore>(
    jobs: &S,
    command: OutboxCommand,
) -> anyhow::Result<String> {
    let mut out = String::new();
    match command {
        OutboxCommand::Dead { .. } => unreachable!("`outbox` turns it into a list"),
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
            // What the first attempt froze holds the recipient's address and the email's text:
            // shown by field names only, as the rest of the operator's output shows no address.
            let mut shown = serde_json::to_value(&job)?;
            if let Some(frozen) = job.frozen.as_ref().and_then(|f| f.as_object()) {
                shown["frozen"] = frozen.keys().cloned().collect();
            }
            writeln!(out, "{}", serde_json::to_string_pretty(&shown)?)?;
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
        OutboxCommand::Retry { key: Some(key), .. } => {
            if !jobs.redrive(&key).await? {
                bail!("no dead job with operation key {key:?} (only dead jobs can be re-driven)");
            }
            writeln!(
                out,
                "re-driven: {key} is due now, with a fresh attempt budget and horizon and the \
                 same delivery key"
            )?;
        }
        OutboxCommand::Retry {
            key: None,
            kind,
            since,
            reason_like,
            yes,
            ..
        } => {
            let filter = DeadFilter {
                kind,
                since,
                reason_contains: reason_like,
            };
            redrive_dead(jobs, &filter, yes, &mut out).await?;
        }
    }
    Ok(out)
}

/// How many dead jobs a bulk re-drive's dry run shows.
const DRY_RUN_SAMPLE: u32 = 10;

/// `oncely outbox retry --kind … --since … --reason-like …`: without `yes` a dry run (how many
/// match, a sample, how many the provider may no longer deduplicate), with it the re-drive.
async fn redrive_dead<S: JobStore>(
    jobs: &S,
    filter: &DeadFilter,
    yes: bool,
    out: &mut String,
) -> anyhow::Result<()> {
    let which = describe(filter);
    if yes {
        let redriven = jobs.redrive_dead(filter).await?;
        writeln!(
            out,
            "re-driven: {redriven} dead jobs ({which}) are due now, each with a fresh attempt \
             budget and horizon and its own delivery key"
        )?;
        return Ok(());
    }
    let found = jobs
        .dead_jobs(filter, DRY_RUN_SAMPLE, PROVIDER_DEDUPE_WINDOW)
        .await?;
    writeln!(
        out,
        "dry run: {} dead jobs match ({which}); nothing was changed",
        found.matching
    )?;
    for job in &found.sample {
        writeln!(
            out,
            "  {:<50}  {}",
            job.operation_key,
            job.last_error.as_deref().unwrap_or_default()
        )?;
    }
    let more = found.matching - found.sample.len() as i64;
    if more > 0 {
        writeln!(out, "  … and {more} more")?;
    }
    let hours = PROVIDER_DEDUPE_WINDOW.as_secs() / 3600;
    writeln!(
        out,
        "{} of them had an attempt with an unknown outcome (unknown, abandoned) more than {hours} h \
         ago: it may have been delivered, and the provider no longer deduplicates its key, so \
         re-driving it may deliver a second copy",
        found.unknown_past_window
    )?;
    if found.matching > 0 {
        writeln!(out, "to re-drive them, run the same command with --yes")?;
    }
    Ok(())
}

/// The filters of a bulk re-drive, in words.
fn describe(filter: &DeadFilter) -> String {
    let mut parts = Vec::new();
    if let Some(kind) = &filter.kind {
        parts.push(format!("kind {kind}"));
    }
    if let Some(since) = filter.since {
        let since = since
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|_| since.to_string());
        parts.push(format!("dead since {since}"));
    }
    if let Some(reason) = &filter.reason_contains {
        parts.push(format!("last error containing {reason:?}"));
    }
    if parts.is_empty() {
        parts.push("every dead job".into());
    }
    parts.join(", ")
}

/// The name of a new tenant: a valid tenant id other than `default`.
pub fn tenant_name(name: &str) -> anyhow::Result<oncely::TenantId> {
    let tenant = oncely::TenantId::parse(name).map_err(|e| anyhow::anyhow!("{e}"))?;
    if tenant == oncely::TenantId::default() {
        bail!("`default` is the tenant of requests without an API key; choose another name");
    }
    Ok(tenant)
}

/// `oncely tenant create`: creates `tenant` with a new API key and returns the key (only its
/// hash is stored). A name that is taken says so; any other failure (the database down, busy)
/// says what it was.
pub async fn create_tenant<B: Accounts>(
    backend: &B,
    tenant: &oncely::TenantId,
) -> anyhow::Result<String> {
    use crate::routes::tenants::{hash_api_key, new_api_key};
    let key = new_api_key();
    match backend
        .create_tenant(tenant.as_str(), &hash_api_key(&key))
        .await
    {
        Ok(()) => Ok(key),
        Err(AccountError::Conflict(_)) => bail!("tenant {tenant} already exists"),
        Err(error) => {
            Err(anyhow::Error::new(error).context(format!("tenant {tenant} was not created")))
        }
    }
}

/// `oncely key show`: the state of one idempotency key, and the answer it replays.
pub async fn key_show<B: Backend>(command: KeyCommand) -> anyhow::Result<String> {
    use oncely::store::{KeyStore, Record, RecordState};
    use oncely::{IdempotencyKey, Scope, TenantId};
    let KeyCommand::Show {
        key,
        route,
        method,
        tenant,
        database,
    } = command;
    let tenant = TenantId::parse(tenant).map_err(|e| anyhow::anyhow!("{e}"))?;
    let key = IdempotencyKey::parse(&key).map_err(|e| anyhow::anyhow!("{e}"))?;
    let scope = Scope::new(tenant, method.to_uppercase(), route, key);
    let backend = B::connect(&database.database_url, COMMAND_POOL).await?;
    let record: Option<Record> = backend.keys().get(&scope).await?;
    let mut out = String::new();
    writeln!(
        out,
        "tenant {} · {} {} · key {:?}",
        scope.tenant,
        scope.method,
        scope.route,
        scope.key.as_str()
    )?;
    match record {
        None => writeln!(
            out,
            "not found: never used, or its retention has passed (a request with it runs afresh)"
        )?,
        Some(record) => {
            writeln!(out, "fingerprint: {:?}", record.fingerprint)?;
            match record.state {
                RecordState::InProgress { lease_active: true } => {
                    writeln!(out, "state: in progress (lease running)")?
                }
                RecordState::InProgress {
                    lease_active: false,
                } => writeln!(
                    out,
                    "state: in progress, lease expired (the next retry takes it over)"
                )?,
                RecordState::Completed(response) => {
                    writeln!(out, "state: completed; replays status {}", response.status)?;
                    for (name, value) in &response.headers {
                        writeln!(out, "  {name}: {value}")?;
                    }
                    writeln!(out, "  body: {}", String::from_utf8_lossy(&response.body))?;
                }
                RecordState::Tombstoned { reason } => {
                    writeln!(out, "state: tombstoned ({reason})")?
                }
            }
        }
    }
    Ok(out)
}
