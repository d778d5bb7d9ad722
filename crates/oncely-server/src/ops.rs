//! Operator commands: `oncely outbox list|show|retry`, `oncely key show`.

use std::fmt::Write;

use anyhow::bail;
use oncely_outbox::store::{BulkRedrive, DeadFilter, JobFilter, PROVIDER_DEDUPE_WINDOW};
use oncely_outbox::{JobStatus, JobStore};
use time::OffsetDateTime;

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
                JobStatusArg::Skipped => JobStatus::Skipped,
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
            // shown by field names only, as the rest of the operator's output shows no address
            // (the recipient a development payload names is masked).
            let mut shown = serde_json::to_value(&job)?;
            if let Some(frozen) = job.frozen.as_ref().and_then(|f| f.as_object()) {
                shown["frozen"] = frozen.keys().cloned().collect();
            }
            if let Some(to) = job.payload.get("recipient").and_then(|to| to.as_str()) {
                shown["payload"]["recipient"] = crate::email::masked(to).into();
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
            until,
            reason_like,
            expect,
            yes,
            ..
        } => {
            if let (Some(since), Some(until)) = (since, until)
                && until < since
            {
                bail!(
                    "--until ({}) is before --since ({})",
                    rfc3339(until),
                    rfc3339(since)
                );
            }
            let filter = DeadFilter {
                kind,
                since,
                until,
                reason_contains: reason_like,
            };
            if yes {
                redrive_dead(jobs, &filter, expect, &mut out).await?;
            } else {
                dry_run(jobs, &filter, &mut out).await?;
            }
        }
    }
    Ok(out)
}

/// How many dead jobs a bulk re-drive's dry run shows.
const DRY_RUN_SAMPLE: u32 = 10;

/// `oncely outbox retry --kind … --since … --reason-like … --yes [--expect N]`: re-drives the
/// matching dead jobs, or with `expect` refuses (changing nothing) unless exactly that many
/// match.
async fn redrive_dead<S: JobStore>(
    jobs: &S,
    filter: &DeadFilter,
    expect: Option<u64>,
    out: &mut String,
) -> anyhow::Result<()> {
    let which = describe(filter);
    match jobs.redrive_dead(filter, expect).await? {
        BulkRedrive::Redriven(redriven) => writeln!(
            out,
            "re-driven: {redriven} dead jobs ({which}) are due now, each with a fresh attempt \
             budget and horizon and its own delivery key"
        )?,
        BulkRedrive::CountDiffers { matching } => bail!(
            "refused: {matching} dead jobs match ({which}), not the {} that --expect says; \
             nothing was changed. Run the dry run again (without --yes) to see them",
            expect.unwrap_or_default()
        ),
    }
    Ok(())
}

/// `oncely outbox retry --kind … --since … --reason-like …` without `--yes`: how many dead jobs
/// match, a sample, how many the provider may no longer deduplicate, and the command that
/// re-drives exactly those.
async fn dry_run<S: JobStore>(
    jobs: &S,
    filter: &DeadFilter,
    out: &mut String,
) -> anyhow::Result<()> {
    let which = describe(filter);
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
        let until = filter.until.unwrap_or(found.as_of);
        let exact = DeadFilter {
            until: Some(until),
            ..filter.clone()
        };
        writeln!(
            out,
            "to re-drive exactly these {} jobs (a job that dies after this dry run is left out; \
             if the count has changed by then, nothing is re-driven), run against the same \
             database:",
            found.matching
        )?;
        writeln!(out, "  {}", redrive_command(&exact, found.matching))?;
    }
    Ok(())
}

/// The command that re-drives what `filter` matches if exactly `expect` jobs match.
fn redrive_command(filter: &DeadFilter, expect: i64) -> String {
    let mut words = vec!["oncely".to_owned(), "outbox".into(), "retry".into()];
    let mut option = |name: &str, value: String| {
        // `--name=value`: a value that starts with `-` is not read as another option. A value
        // from the command line holds no NUL, the one thing a shell cannot quote.
        let word = format!("{name}={value}");
        words.push(shlex::try_quote(&word).map_or_else(|_| format!("{word:?}"), Into::into));
    };
    if let Some(kind) = &filter.kind {
        option("--kind", kind.clone());
    }
    if let Some(since) = filter.since {
        option("--since", rfc3339(since));
    }
    if let Some(until) = filter.until {
        option("--until", rfc3339(until));
    }
    if let Some(reason) = &filter.reason_contains {
        option("--reason-like", reason.clone());
    }
    option("--expect", expect.to_string());
    words.push("--yes".into());
    words.join(" ")
}

/// A moment as the command line takes it back, exactly (RFC 3339, UTC).
fn rfc3339(at: OffsetDateTime) -> String {
    at.to_offset(time::UtcOffset::UTC)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| at.to_string())
}

/// The filters of a bulk re-drive, in words.
fn describe(filter: &DeadFilter) -> String {
    let mut parts = Vec::new();
    if let Some(kind) = &filter.kind {
        parts.push(format!("kind {kind}"));
    }
    if let Some(since) = filter.since {
        parts.push(format!("dead since {}", rfc3339(since)));
    }
    if let Some(until) = filter.until {
        parts.push(format!("dead by {}", rfc3339(until)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// Second review of issue 14: `--reason-like -recipient` was printed as two words, and clap
    /// then read the value as an unknown option: the printed command could not be pasted.
    #[test]
    fn the_printed_redrive_command_parses_back_whatever_its_values() {
        let filter = DeadFilter {
            kind: Some("email.verification".into()),
            reason_contains: Some("-recipient 'quoted' $HOME".into()),
            ..DeadFilter::default()
        };
        let printed = redrive_command(&filter, 2);
        let words = shlex::split(&printed).expect("a shell can split it");
        let cli =
            crate::cli::Cli::try_parse_from(&words).unwrap_or_else(|e| panic!("{printed}: {e}"));
        let crate::cli::Command::Outbox(OutboxCommand::Retry {
            reason_like,
            expect,
            ..
        }) = cli.command
        else {
            panic!("not a retry: {printed}")
        };
        assert_eq!(reason_like.as_deref(), Some("-recipient 'quoted' $HOME"));
        assert_eq!(expect, Some(2));
    }
}
