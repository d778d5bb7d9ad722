//! Operator commands: `oncely outbox list|dead|show|retry`, `oncely key show`,
//! `oncely tenant create|list|rotate-key|set`,
//! `oncely tenant webhook add|list|disable|enable|rotate|remove`, `oncely prune`, and what
//! `oncely migrate` reports.
//!
//! Each prints for people (tables whose columns fit their content, times as
//! `2025-01-31 08:00:00 UTC`, control characters escaped), or with `--json` exactly one JSON
//! document for scripts (an array for lists, an object otherwise; times RFC 3339): the views
//! below ([`JobView`], [`ShowView`], …) are that contract, documented field by field in
//! docs/operations.md. A failure is an error; [`failed`] prints it (one line on stderr, or one
//! JSON object there with `--json`) and picks the exit code: 3 not found, 4 refused
//! ([`Failure`]), 1 anything else (clap's usage errors: 2).

use std::fmt::Write;
use std::process::ExitCode;

use anyhow::bail;
use oncely_outbox::job::AttemptRecord;
use oncely_outbox::store::{BulkRedrive, DeadFilter, JobFilter, PROVIDER_DEDUPE_WINDOW};
use oncely_outbox::{JobRecord, JobStatus, JobStore, Settlement};
use serde::Serialize;
use serde_json::{Value, json};
use time::OffsetDateTime;
use unicode_width::UnicodeWidthStr;
use uuid::Uuid;

use crate::accounts::{AccountError, Accounts, EndpointRecord, TenantRecord, from_millis};
use crate::backend::{Backend, COMMAND_POOL};
use crate::cli::{
    EmailDelivery, JobRefKind, KeyCommand, OutboxCommand, OutputArgs, PruneArgs, TenantCommand,
    WebhookCommand,
};
use crate::webhooks::EventType;
use crate::webhooks::events::subscribed;

// ---------------------------------------------------------------------------------------------
// Failures and output

/// Why an operator command refused or found nothing: its exit code and its JSON `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No such job, key or tenant (exit 3).
    NotFound,
    /// `outbox retry` of a job that was sent (exit 4).
    AlreadySent,
    /// `outbox retry` of a job that is still pending (exit 4).
    StillPending,
    /// `outbox retry` of a job deliberately not sent (exit 4): skipped jobs are never re-driven.
    Skipped,
    /// `outbox retry --expect N --yes` found another number of dead jobs (exit 4).
    CountDiffers,
    /// `tenant create` of a name that is taken (exit 4).
    TenantExists,
    /// A JOB that is both an operation key and another job's id (exit 4).
    Ambiguous,
    /// `outbox settle` of a job that is not parked, or `outbox retry` of one that is (exit 4).
    Parked,
    /// `inbox expect`: fewer messages came than were expected, in the time given (exit 3).
    Timeout,
    /// `inbox expect`: the messages came, but none has a link that matches (exit 4).
    NoMatchingLink,
}

impl Failure {
    /// The process's exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::NotFound | Self::Timeout => 3,
            _ => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::AlreadySent => "already_sent",
            Self::StillPending => "still_pending",
            Self::Skipped => "skipped",
            Self::CountDiffers => "count_differs",
            Self::TenantExists => "tenant_exists",
            Self::Ambiguous => "ambiguous",
            Self::Parked => "parked",
            Self::Timeout => "timeout",
            Self::NoMatchingLink => "no_matching_link",
        }
    }
}

/// An operator command that found nothing or refused: [`Failure`] says which, the message says
/// what to do.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CommandError {
    /// Which failure.
    pub failure: Failure,
    /// One line for people.
    pub message: String,
}

pub(crate) fn refuse(failure: Failure, message: impl Into<String>) -> anyhow::Error {
    CommandError {
        failure,
        message: message.into(),
    }
    .into()
}

/// Prints why a command failed on stderr — `oncely: <message>`, or with `json` one JSON object
/// `{"error": "<not_found|already_sent|…|failed>", "message": "…"}` — and returns its exit
/// code: a [`Failure`]'s, else 1.
pub fn failed(error: &anyhow::Error, json: bool) -> ExitCode {
    let failure = error.downcast_ref::<CommandError>().map(|e| e.failure);
    // One line, each cause once, never a backtrace.
    let message = crate::startup::one_line(error);
    if json {
        let code = failure.map_or("failed", Failure::name);
        eprintln!("{}", json!({ "error": code, "message": message }));
    } else {
        eprintln!("oncely: {message}");
    }
    ExitCode::from(failure.map_or(1, Failure::exit_code))
}

/// `value` as one JSON document (with `--json`), else what `human` writes.
fn render<T: Serialize>(
    output: OutputArgs,
    value: &T,
    human: impl FnOnce(&mut String) -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let mut out = String::new();
    if output.json {
        out = serde_json::to_string_pretty(value)?;
        out.push('\n');
    } else {
        human(&mut out)?;
    }
    Ok(out)
}

/// A moment for people: `2025-01-31 08:00:00 UTC`.
pub(crate) fn when(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    format!(
        "{}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// An optional moment for people (`-` when there is none).
fn when_or_dash(at: Option<OffsetDateTime>) -> String {
    at.map_or_else(|| "-".into(), when)
}

/// Text from the database or a provider, safe on a terminal and on one line: control
/// characters (newlines, escape sequences) are shown escaped.
fn clean(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// Lines of a table: the header and then each row, every column as wide as its widest cell
/// (the last column unpadded), two spaces between columns.
fn table(header: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.width()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.width());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut line = String::new();
        let last = cells.len().saturating_sub(1);
        for (i, (cell, width)) in cells.into_iter().zip(&widths).enumerate() {
            line.push_str(cell);
            if i < last {
                line.push_str(&" ".repeat(width - cell.width() + 2));
            }
        }
        line.trim_end().to_owned()
    };
    std::iter::once(line(header.to_vec()))
        .chain(
            rows.iter()
                .map(|row| line(row.iter().map(String::as_str).collect())),
        )
        .collect()
}

// ---------------------------------------------------------------------------------------------
// oncely outbox …

/// A job in `outbox list --json` (and the top of `outbox show --json`).
#[derive(Debug, Serialize)]
pub struct JobView {
    /// Row id: `outbox show ID` finds it.
    pub id: i64,
    /// The business intent.
    pub operation_key: String,
    /// The handler kind.
    pub kind: String,
    /// `pending`, `sent`, `dead`, `skipped`, `unknown` (parked).
    pub status: &'static str,
    /// Attempts over the job's whole life, every re-drive included.
    pub attempts: i64,
    /// Attempts since it was enqueued or last re-driven (what the retry budget counts).
    pub attempts_since_redrive: i32,
    /// How many of those spent no budget (throttled, paused).
    pub free_attempts: i32,
    /// When it was enqueued.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Pending jobs: when they run next (while an attempt runs, when its lease ends).
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_run_at: Option<OffsetDateTime>,
    /// When it was sent.
    #[serde(with = "time::serde::rfc3339::option")]
    pub sent_at: Option<OffsetDateTime>,
    /// When it died.
    #[serde(with = "time::serde::rfc3339::option")]
    pub dead_at: Option<OffsetDateTime>,
    /// When it was skipped (deliberately not sent).
    #[serde(with = "time::serde::rfc3339::option")]
    pub skipped_at: Option<OffsetDateTime>,
    /// When it was last re-driven.
    #[serde(with = "time::serde::rfc3339::option")]
    pub redriven_at: Option<OffsetDateTime>,
    /// Parked jobs: since when (they wait to be settled).
    #[serde(with = "time::serde::rfc3339::option")]
    pub parked_at: Option<OffsetDateTime>,
    /// The last error, or why it is dead.
    pub last_error: Option<String>,
    /// The provider's id of the delivery.
    pub provider_message_id: Option<String>,
    /// The key forwarded to the provider on every attempt.
    pub delivery_key: Uuid,
}

impl From<&JobRecord> for JobView {
    fn from(job: &JobRecord) -> Self {
        Self {
            id: job.id,
            operation_key: job.operation_key.clone(),
            kind: job.kind.clone(),
            status: job.status.as_str(),
            attempts: job.all_attempts,
            attempts_since_redrive: job.attempts,
            free_attempts: job.free_attempts,
            created_at: job.created_at,
            next_run_at: (job.status == JobStatus::Pending).then_some(job.run_after),
            sent_at: job.sent_at,
            dead_at: job.dead_at,
            skipped_at: job.skipped_at,
            redriven_at: job.redriven_at,
            parked_at: job.parked_at,
            last_error: job.last_error.clone(),
            provider_message_id: job.provider_message_id.clone(),
            delivery_key: job.delivery_key,
        }
    }
}

/// `outbox show --json`: the job, its payload, and every attempt of its life.
#[derive(Debug, Serialize)]
pub struct ShowView {
    /// The job.
    #[serde(flatten)]
    pub job: JobView,
    /// How many times an operator re-drove it.
    pub redrives: usize,
    /// The handler's input (ids, never addresses).
    pub payload: serde_json::Value,
    /// The field names of what its first attempt froze (the values hold the recipient's
    /// address and the email's text); `null` if nothing is frozen.
    pub frozen: Option<Vec<String>>,
    /// Every attempt, oldest first.
    pub history: Vec<AttemptView>,
}

/// One attempt in `outbox show --json`.
#[derive(Debug, Serialize)]
pub struct AttemptView {
    /// 1, 2, … over the job's whole life (a re-drive does not start again at 1).
    pub number: usize,
    /// The first attempt after a re-drive.
    pub after_redrive: bool,
    /// The worker that made it.
    pub worker: String,
    /// When it started.
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// When it ended; `null` while it runs.
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    /// `sent`, `retry`, `unknown`, `dead`, `expired`, `skipped`, `throttled`, `paused`,
    /// `abandoned`, `parked`; `null` while it runs.
    pub result: Option<String>,
    /// The provider's id, if it sent.
    pub provider_message_id: Option<String>,
    /// What went wrong.
    pub error: Option<String>,
    /// Its point of no return: `ahead` (its message not handed over yet — abandoned so, it
    /// reached no one), `passed` (handed over: it may have reached the provider), `null`
    /// (unknown: not recorded by the attempt).
    pub point_of_no_return: Option<String>,
    /// When it passed its point of no return.
    #[serde(with = "time::serde::rfc3339::option")]
    pub handed_over_at: Option<OffsetDateTime>,
}

/// A job's payload as operators see it: ids; the recipient a development payload names (for
/// the dev inbox's page) masked, as the rest of their output shows no address.
fn masked_payload(payload: &serde_json::Value) -> serde_json::Value {
    let mut shown = payload.clone();
    if let Some(to) = payload.get("recipient").and_then(|to| to.as_str()) {
        shown["recipient"] = crate::email::masked(to).into();
    }
    shown
}

impl ShowView {
    fn new(job: &JobRecord, attempts: Vec<AttemptRecord>) -> Self {
        let mut history: Vec<AttemptView> = Vec::with_capacity(attempts.len());
        let mut previous: Option<i32> = None;
        for (i, attempt) in attempts.into_iter().enumerate() {
            // Each re-drive numbers its attempts from 1 again.
            let after_redrive = previous.is_some_and(|p| attempt.attempt <= p);
            previous = Some(attempt.attempt);
            history.push(AttemptView {
                number: i + 1,
                after_redrive,
                worker: attempt.worker,
                started_at: attempt.started_at,
                finished_at: attempt.finished_at,
                result: attempt.result,
                provider_message_id: attempt.provider_message_id,
                error: attempt.error,
                point_of_no_return: attempt.point_of_no_return,
                handed_over_at: attempt.handed_over_at,
            });
        }
        let redrives = history.iter().filter(|a| a.after_redrive).count()
            + usize::from(redriven_since(job.redriven_at, &history));
        Self {
            job: JobView::from(job),
            redrives,
            payload: masked_payload(&job.payload),
            frozen: job.frozen.as_ref().map(|f| {
                f.as_object()
                    .map(|o| o.keys().cloned().collect())
                    .unwrap_or_default()
            }),
            history,
        }
    }
}

/// Whether a job re-driven at `redriven_at` was re-driven after its last attempt started (or
/// has none): not attempted since.
fn redriven_since(redriven_at: Option<OffsetDateTime>, history: &[AttemptView]) -> bool {
    redriven_at.is_some_and(|at| history.last().is_none_or(|last| last.started_at < at))
}

/// Runs an outbox command on backend `B` and returns what to print.
pub async fn outbox<B: Accounts>(command: OutboxCommand) -> anyhow::Result<String> {
    // `dead` is `list --status dead`, `unknown` is `list --status unknown`.
    let command = match command {
        OutboxCommand::Dead(args) => args.list(JobStatus::Dead),
        OutboxCommand::Unknown(args) => args.list(JobStatus::Unknown),
        other => other,
    };
    let backend: B =
        crate::startup::open_existing(&command.database().location(), COMMAND_POOL).await?;
    run_outbox_command(&backend.jobs(true), command).await
}

async fn run_outbox_command<S: JobStore>(
    jobs: &S,
    command: OutboxCommand,
) -> anyhow::Result<String> {
    match command {
        OutboxCommand::Dead(_) | OutboxCommand::Unknown(_) => {
            unreachable!("`outbox` turns it into a list")
        }
        OutboxCommand::Settle {
            job,
            by,
            sent,
            output,
            ..
        } => {
            let settlement = if sent {
                Settlement::Sent
            } else {
                Settlement::Resend
            };
            settle_one(jobs, &job, by, settlement, output).await
        }
        OutboxCommand::List {
            kind,
            status,
            limit,
            output,
            ..
        } => {
            let found = jobs
                .list(&JobFilter {
                    kind,
                    status,
                    limit,
                })
                .await?;
            let views: Vec<JobView> = found.iter().map(JobView::from).collect();
            render(output, &views, |out| list_table(&views, out))
        }
        OutboxCommand::Show {
            job, by, output, ..
        } => {
            let job = find_job(jobs, &job, by).await?;
            let view = ShowView::new(&job, jobs.attempts(job.id).await?);
            render(output, &view, |out| show(&view, out))
        }
        OutboxCommand::Retry {
            key: Some(key),
            by,
            output,
            ..
        } => redrive_one(jobs, &key, by, output).await,
        OutboxCommand::Retry {
            key: None,
            kind,
            since,
            until,
            reason_like,
            expect,
            yes,
            output,
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
                redrive_dead(jobs, &filter, expect, output).await
            } else {
                dry_run(jobs, &filter, output).await
            }
        }
    }
}

/// The human `outbox list`: one row per job.
fn list_table(jobs: &[JobView], out: &mut String) -> anyhow::Result<()> {
    if jobs.is_empty() {
        writeln!(out, "no jobs")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|job| {
            // When it runs next, or when it finished.
            let at = job
                .next_run_at
                .or(job.sent_at)
                .or(job.dead_at)
                .or(job.skipped_at)
                .or(job.parked_at);
            vec![
                job.id.to_string(),
                clean(&job.kind),
                job.status.to_owned(),
                job.attempts.to_string(),
                clean(&job.operation_key),
                when(job.created_at),
                when_or_dash(at),
                clean(job.last_error.as_deref().unwrap_or_default()),
            ]
        })
        .collect();
    let header = [
        "id",
        "kind",
        "status",
        "attempts",
        "operation key",
        "created",
        "next run / ended / parked",
        "last error",
    ];
    for line in table(&header, &rows) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The human `outbox show`.
fn show(view: &ShowView, out: &mut String) -> anyhow::Result<()> {
    let job = &view.job;
    writeln!(
        out,
        "job {} · {} · {}",
        job.id,
        clean(&job.kind),
        clean(&job.operation_key)
    )?;
    let status = match (job.sent_at, job.dead_at, job.skipped_at) {
        (Some(at), _, _) if job.status == "sent" => format!("sent at {}", when(at)),
        (_, Some(at), _) if job.status == "dead" => format!("dead since {}", when(at)),
        (_, _, Some(at)) if job.status == "skipped" => format!("skipped at {}", when(at)),
        _ if job.status == "unknown" => match job.parked_at {
            Some(at) => format!(
                "parked since {} (settle it: oncely outbox settle)",
                when(at)
            ),
            None => "parked (settle it: oncely outbox settle)".to_owned(),
        },
        _ => job.status.to_owned(),
    };
    let mut fields = vec![("status", status), ("created", when(job.created_at))];
    if let Some(at) = job.next_run_at {
        fields.push(("next run", when(at)));
    }
    if let Some(error) = &job.last_error {
        fields.push(("last error", clean(error)));
    }
    if let Some(at) = job.redriven_at {
        let times = match view.redrives {
            1 => "once".to_owned(),
            n => format!("{n} times"),
        };
        fields.push(("re-driven", format!("{times}, last at {}", when(at))));
    }
    fields.push(("delivery key", job.delivery_key.to_string()));
    if let Some(id) = &job.provider_message_id {
        fields.push(("provider id", clean(id)));
    }
    fields.push(("payload", clean(&view.payload.to_string())));
    if let Some(frozen) = &view.frozen {
        fields.push((
            "frozen",
            format!("{} (field names only)", clean(&frozen.join(", "))),
        ));
    }
    let width = fields.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    for (name, value) in &fields {
        writeln!(out, "{name:<width$}  {value}")?;
    }
    writeln!(out, "attempts: {}", view.history.len())?;
    let rows: Vec<Vec<String>> = view
        .history
        .iter()
        .map(|a| {
            vec![
                a.number.to_string(),
                when(a.started_at),
                when_or_dash(a.finished_at),
                clean(&a.worker),
                a.result.as_deref().unwrap_or("running").to_owned(),
                clean(a.provider_message_id.as_deref().unwrap_or_default()),
                clean(a.error.as_deref().unwrap_or_default()),
            ]
        })
        .collect();
    let header = [
        "#",
        "started",
        "ended",
        "worker",
        "result",
        "provider id",
        "error",
    ];
    let lines = table(&header, &rows);
    for (i, line) in lines.iter().enumerate() {
        // Row i is attempt i (the header is line 0).
        if i > 0 && view.history[i - 1].after_redrive {
            writeln!(out, "  -- re-driven --")?;
        }
        writeln!(out, "  {line}")?;
    }
    if redriven_since(job.redriven_at, &view.history) {
        writeln!(
            out,
            "  -- re-driven at {} --",
            when_or_dash(view.job.redriven_at)
        )?;
    }
    Ok(())
}

/// The job `job` names: its operation key, or its id (a number as `list` prints it); `by`
/// reads it only as one of them. A number that is both one job's operation key and another's
/// id is refused, naming both.
async fn find_job<S: JobStore>(
    jobs: &S,
    job: &str,
    by: Option<JobRefKind>,
) -> anyhow::Result<JobRecord> {
    // Only a number exactly as `list` prints it (no sign, no leading zeros) is an id.
    let id = job.parse::<i64>().ok().filter(|id| id.to_string() == job);
    if by == Some(JobRefKind::Id) && id.is_none() {
        bail!("--by id: {job:?} is not a job id (the number `oncely outbox list` prints first)");
    }
    let by_key = match by {
        Some(JobRefKind::Id) => None,
        _ => jobs.job(job).await?,
    };
    let by_id = match (by, id) {
        (Some(JobRefKind::Key), _) | (_, None) => None,
        (_, Some(id)) => jobs.job_by_id(id).await?,
    };
    match (by_key, by_id) {
        (Some(keyed), Some(numbered)) if keyed.id != numbered.id => Err(refuse(
            Failure::Ambiguous,
            format!(
                "{job} is the operation key of job {} and the id of job {}: add --by key or --by id",
                keyed.id, numbered.id
            ),
        )),
        (Some(found), _) | (None, Some(found)) => Ok(found),
        (None, None) => Err(refuse(
            Failure::NotFound,
            match (by, id) {
                (Some(JobRefKind::Id), _) => format!("no job with id {job}"),
                (None, Some(_)) => format!("no job with operation key or id {job:?}"),
                _ => format!("no job with operation key {job:?}"),
            },
        )),
    }
}

/// `oncely outbox retry JOB`: re-drives one dead job; a sent or pending job, or none, is a
/// failure that says which.
async fn redrive_one<S: JobStore>(
    jobs: &S,
    job: &str,
    by: Option<JobRefKind>,
    output: OutputArgs,
) -> anyhow::Result<String> {
    let found = find_job(jobs, job, by).await?;
    let key = &found.operation_key;
    if jobs.redrive(key).await? {
        let value = json!({ "id": found.id, "operation_key": key, "redriven": true });
        return render(output, &value, |out| {
            writeln!(
                out,
                "re-driven: {} (job {}) is due now, with a fresh attempt budget and horizon and \
                 the same delivery key",
                clean(key),
                found.id
            )?;
            Ok(())
        });
    }
    // It was not dead: say what it is now.
    let now = jobs.job(key).await?;
    let named = format!("job {} ({})", found.id, clean(key));
    match now {
        None => Err(refuse(
            Failure::NotFound,
            format!("{named} is gone (pruned meanwhile)"),
        )),
        Some(job) if job.status == JobStatus::Sent => Err(refuse(
            Failure::AlreadySent,
            format!(
                "{named} was already sent, at {}: only dead jobs can be re-driven",
                when_or_dash(job.sent_at)
            ),
        )),
        Some(job) if job.status == JobStatus::Pending => Err(refuse(
            Failure::StillPending,
            format!(
                "{named} is still pending (next run at {}): only dead jobs can be re-driven",
                when(job.run_after)
            ),
        )),
        Some(job) if job.status == JobStatus::Skipped => Err(refuse(
            Failure::Skipped,
            format!(
                "{named} was deliberately not sent ({}): skipped jobs are never re-driven",
                job.last_error.as_deref().map_or("skipped".into(), clean)
            ),
        )),
        Some(job) if job.status == JobStatus::Unknown => Err(refuse(
            Failure::Parked,
            format!(
                "{named} is parked (the provider may have accepted it): settle it with `oncely \
                 outbox settle {} --sent` or `--resend`",
                found.id
            ),
        )),
        Some(job) => bail!(
            "{named} is {} but was not re-driven (it changed meanwhile): try again",
            job.status.as_str()
        ),
    }
}

/// `oncely outbox settle JOB --sent|--resend`: settles one parked job, or says what it is now.
async fn settle_one<S: JobStore>(
    jobs: &S,
    job: &str,
    by: Option<JobRefKind>,
    settlement: Settlement,
    output: OutputArgs,
) -> anyhow::Result<String> {
    let found = find_job(jobs, job, by).await?;
    let named = format!("job {} ({})", found.id, clean(&found.operation_key));
    if jobs.settle(found.id, settlement).await? {
        let value = json!({
            "id": found.id,
            "operation_key": found.operation_key,
            "settled": settlement.as_str(),
        });
        return render(output, &value, |out| {
            match settlement {
                Settlement::Sent => writeln!(
                    out,
                    "settled as sent: {named} is recorded sent by the next worker of its kind, \
                     without sending it again"
                )?,
                Settlement::Resend => writeln!(
                    out,
                    "settled for resending: {named} is due now, under the same delivery key, \
                     with a fresh attempt budget and horizon"
                )?,
            }
            Ok(())
        });
    }
    let status = match jobs.job_by_id(found.id).await? {
        None => {
            return Err(refuse(
                Failure::NotFound,
                format!("{named} is gone (pruned meanwhile)"),
            ));
        }
        Some(job) => job.status,
    };
    Err(refuse(
        Failure::Parked,
        format!(
            "{named} is {}, not parked: only parked jobs (`oncely outbox unknown`) are settled",
            status.as_str()
        ),
    ))
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
    output: OutputArgs,
) -> anyhow::Result<String> {
    let which = describe(filter);
    match jobs.redrive_dead(filter, expect).await? {
        BulkRedrive::Redriven(redriven) => {
            render(output, &json!({ "redriven": redriven }), |out| {
                writeln!(
                    out,
                    "re-driven: {redriven} dead jobs ({which}) are due now, each with a fresh \
                     attempt budget and horizon and its own delivery key"
                )?;
                Ok(())
            })
        }
        BulkRedrive::CountDiffers { matching } => Err(refuse(
            Failure::CountDiffers,
            format!(
                "refused: {matching} dead jobs match ({which}), not the {} that --expect says; \
                 nothing was changed. Run the dry run again (without --yes) to see them",
                expect.unwrap_or_default()
            ),
        )),
    }
}

/// `outbox retry --kind … --json` without `--yes`.
#[derive(Debug, Serialize)]
struct DryRunView {
    dry_run: bool,
    matching: i64,
    #[serde(with = "time::serde::rfc3339")]
    as_of: OffsetDateTime,
    unknown_past_window: i64,
    sample: Vec<SampleView>,
    /// The command that re-drives exactly these, for a shell; `null` when none match.
    command: Option<String>,
    /// The same command's arguments after `oncely`, one string each.
    args: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
struct SampleView {
    operation_key: String,
    last_error: Option<String>,
}

/// `oncely outbox retry --kind … --since … --reason-like …` without `--yes`: how many dead jobs
/// match, a sample, how many the provider may no longer deduplicate, and the command that
/// re-drives exactly those.
async fn dry_run<S: JobStore>(
    jobs: &S,
    filter: &DeadFilter,
    output: OutputArgs,
) -> anyhow::Result<String> {
    let which = describe(filter);
    let found = jobs
        .dead_jobs(filter, DRY_RUN_SAMPLE, PROVIDER_DEDUPE_WINDOW)
        .await?;
    let args = (found.matching > 0).then(|| {
        let until = filter.until.unwrap_or(found.as_of);
        let exact = DeadFilter {
            until: Some(until),
            ..filter.clone()
        };
        redrive_args(&exact, found.matching)
    });
    let view = DryRunView {
        dry_run: true,
        matching: found.matching,
        as_of: found.as_of,
        unknown_past_window: found.unknown_past_window,
        sample: found
            .sample
            .iter()
            .map(|job| SampleView {
                operation_key: job.operation_key.clone(),
                last_error: job.last_error.clone(),
            })
            .collect(),
        command: args.as_deref().map(shell_command),
        args,
    };
    render(output, &view, |out| {
        writeln!(
            out,
            "dry run: {} dead jobs match ({which}); nothing was changed",
            found.matching
        )?;
        let rows: Vec<Vec<String>> = view
            .sample
            .iter()
            .map(|job| {
                vec![
                    clean(&job.operation_key),
                    clean(job.last_error.as_deref().unwrap_or_default()),
                ]
            })
            .collect();
        if !rows.is_empty() {
            for line in table(&["operation key", "last error"], &rows) {
                writeln!(out, "  {line}")?;
            }
        }
        let more = found.matching - found.sample.len() as i64;
        if more > 0 {
            writeln!(out, "  … and {more} more")?;
        }
        let hours = PROVIDER_DEDUPE_WINDOW.as_secs() / 3600;
        writeln!(
            out,
            "{} of them had an attempt with an unknown outcome (unknown, abandoned) more than \
             {hours} h ago: it may have been delivered, and the provider no longer deduplicates \
             its key, so re-driving it may deliver a second copy",
            found.unknown_past_window
        )?;
        if let Some(command) = &view.command {
            writeln!(
                out,
                "to re-drive exactly these {} jobs (a job that dies after this dry run is left \
                 out; if the count has changed by then, nothing is re-driven), run against the \
                 same database:",
                found.matching
            )?;
            writeln!(out, "  {command}")?;
        }
        Ok(())
    })
}

/// The arguments (after `oncely`) that re-drive what `filter` matches if exactly `expect` jobs
/// match.
fn redrive_args(filter: &DeadFilter, expect: i64) -> Vec<String> {
    let mut words = vec!["outbox".to_owned(), "retry".into()];
    // `--name=value`: a value that starts with `-` is not read as another option.
    let mut option = |name: &str, value: String| words.push(format!("{name}={value}"));
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
    words
}

/// `oncely` and `args` as one shell line. A value from the command line holds no NUL, the one
/// thing a shell cannot quote.
fn shell_command(args: &[String]) -> String {
    std::iter::once("oncely".to_owned())
        .chain(
            args.iter().map(|word| {
                shlex::try_quote(word).map_or_else(|_| format!("{word:?}"), Into::into)
            }),
        )
        .collect::<Vec<_>>()
        .join(" ")
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
        parts.push(format!("kind {}", clean(kind)));
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

// ---------------------------------------------------------------------------------------------
// oncely tenant …

/// The name of a tenant a command acts on: a valid tenant id other than `default`.
pub fn tenant_name(name: &str) -> anyhow::Result<oncely::TenantId> {
    let tenant = oncely::TenantId::parse(name).map_err(|e| anyhow::anyhow!("{e}"))?;
    if tenant == oncely::TenantId::default() {
        bail!("`default` is the tenant of requests without an API key; choose another name");
    }
    Ok(tenant)
}

/// The name of a new tenant: a [`tenant_name`] other than the reserved ones — `gateway:…` (the
/// tenants of `oncely gateway`, which may share the database: a tenant named so would share
/// keys with a gateway's callers) and `_default` (the templates' folder of tenants without
/// their own), in any case.
pub fn new_tenant_name(name: &str) -> anyhow::Result<oncely::TenantId> {
    let tenant = tenant_name(name)?;
    let prefix = crate::gateway::TENANT_PREFIX;
    if name
        .get(..prefix.len())
        .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
    {
        bail!("names starting with `{prefix}` are the gateway's tenants; choose another name");
    }
    if name.eq_ignore_ascii_case("_default") {
        bail!(
            "`_default` is the templates' folder of tenants without their own; choose another name"
        );
    }
    Ok(tenant)
}

/// What identifies an API key without revealing it: the first 12 hex digits of its SHA-256
/// (the stored hash): `printf %s "$KEY" | sha256sum | cut -c1-12` gives the same.
pub fn key_fingerprint(api_key_hash: &[u8]) -> String {
    let mut hex = hex::encode(api_key_hash);
    hex.truncate(12);
    hex
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
        Err(AccountError::Conflict(_)) => Err(refuse(
            Failure::TenantExists,
            format!(
                "tenant {tenant} already exists (`oncely tenant rotate-key {tenant}` gives it a new key)"
            ),
        )),
        Err(error) => {
            Err(anyhow::Error::new(error).context(format!("tenant {tenant} was not created")))
        }
    }
}

/// A tenant in `tenant list --json`.
#[derive(Debug, Serialize)]
pub struct TenantView {
    /// The tenant's id.
    pub tenant: String,
    /// When it was created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Its API key's fingerprint ([`key_fingerprint`]).
    pub key_fingerprint: String,
    /// The previous key's fingerprint, while that key still works (after a rotation with
    /// `--grace`).
    pub previous_key_fingerprint: Option<String>,
    /// Until when the previous key works.
    #[serde(with = "time::serde::rfc3339::option")]
    pub previous_key_valid_until: Option<OffsetDateTime>,
    /// Where its links return, in order (`tenant set --return-url`).
    pub return_urls: Vec<String>,
    /// How its emails go out: `mail` or `webhook` (`tenant set --email-delivery`).
    pub email_delivery: String,
    /// Its emails' product name (`tenant set --product-name`); null: the service's.
    pub product_name: Option<String>,
    /// Its emails' sender (`tenant set --mail-from`); null: the service's.
    pub mail_from: Option<String>,
    /// Its emails' support address (`tenant set --support-email`); null: the service's.
    pub support_email: Option<String>,
}

impl From<TenantRecord> for TenantView {
    fn from(tenant: TenantRecord) -> Self {
        Self {
            tenant: tenant.id,
            created_at: from_millis(tenant.created_at_ms),
            key_fingerprint: key_fingerprint(&tenant.api_key_hash),
            previous_key_fingerprint: tenant.previous_key_hash.as_deref().map(key_fingerprint),
            previous_key_valid_until: tenant.previous_key_expires_at_ms.map(from_millis),
            return_urls: Vec::new(),
            email_delivery: tenant.email_delivery,
            product_name: tenant.product_name,
            mail_from: tenant.mail_from,
            support_email: tenant.support_email,
        }
    }
}

/// The tenant of `tenant set`, and its return URLs, each checked
/// ([`crate::code::check_return_url`]); the `default` tenant is refused: it has no API key, so
/// its codes could never be exchanged, and no row for branding (the service's settings are its).
fn tenant_to_set(
    name: &str,
    urls: &[String],
    urls_given: bool,
) -> anyhow::Result<oncely::TenantId> {
    let tenant = oncely::TenantId::parse(name).map_err(|e| anyhow::anyhow!("{e}"))?;
    if tenant == oncely::TenantId::default() {
        match urls_given {
            true => bail!(
                "the default tenant takes no return URLs: it has no API key, so its codes could never be exchanged (create a tenant with `oncely tenant create`)"
            ),
            false => bail!(
                "the default tenant has no settings of its own: oncely sends its emails, with the service's branding (ONCELY_PRODUCT_NAME, ONCELY_MAIL_FROM, ONCELY_SUPPORT_EMAIL); create a tenant for anything else (`oncely tenant create`)"
            ),
        }
    }
    for (i, url) in urls.iter().enumerate() {
        crate::code::check_return_url(url)?;
        if urls[..i].contains(url) {
            bail!("{url:?} is given twice");
        }
    }
    Ok(tenant)
}

/// `oncely tenant create|list|rotate-key|set` on backend `B`: what to print.
pub async fn tenant<B: Accounts>(command: TenantCommand) -> anyhow::Result<String> {
    use crate::routes::tenants::{hash_api_key, new_api_key};
    let command = match command {
        TenantCommand::Webhook(command) => return webhook::<B>(command).await,
        command => command,
    };
    let output = command.output();
    // Checked before anything connects.
    let named = match &command {
        TenantCommand::Create { name, .. } => Some(new_tenant_name(name)?),
        TenantCommand::RotateKey { name, .. } => Some(tenant_name(name)?),
        TenantCommand::List { .. } | TenantCommand::Webhook(_) => None,
        TenantCommand::Set {
            name,
            return_urls,
            no_return_urls,
            ..
        } => {
            // At least one of them: clap's group `what` (a usage error, exit 2, otherwise).
            let urls = !return_urls.is_empty() || *no_return_urls;
            Some(tenant_to_set(name, return_urls, urls)?)
        }
    };
    let backend: B =
        crate::startup::open_existing(&command.database().location(), COMMAND_POOL).await?;
    match (command, named) {
        (TenantCommand::Create { .. }, Some(tenant)) => {
            let key = create_tenant(&backend, &tenant).await?;
            let value = json!({
                "tenant": tenant.as_str(),
                "api_key": key,
                "key_fingerprint": key_fingerprint(&hash_api_key(&key)),
            });
            render(output, &value, |out| {
                writeln!(
                    out,
                    "tenant {tenant} created. Its API key (shown once; only a hash is stored):\n{key}"
                )?;
                Ok(())
            })
        }
        (TenantCommand::RotateKey { grace, .. }, Some(tenant)) => {
            let key = new_api_key();
            let grace = grace.unwrap_or_default();
            let Some(rotated) = backend
                .rotate_tenant_key(tenant.as_str(), &hash_api_key(&key), grace)
                .await?
            else {
                return Err(refuse(
                    Failure::NotFound,
                    format!("no tenant {tenant} (`oncely tenant list` shows them)"),
                ));
            };
            let until = rotated.previous_valid_until;
            let value = json!({
                "tenant": tenant.as_str(),
                "api_key": key,
                "key_fingerprint": key_fingerprint(&hash_api_key(&key)),
                "previous_key_valid_until": until.map(rfc3339),
            });
            render(output, &value, |out| {
                let old = match until {
                    Some(at) => format!("keeps working until {}", when(at)),
                    None => "no longer works".to_owned(),
                };
                writeln!(
                    out,
                    "tenant {tenant} has a new API key; the old key {old}. The new key (shown \
                     once; only a hash is stored):\n{key}"
                )?;
                Ok(())
            })
        }
        (
            TenantCommand::Set {
                return_urls,
                no_return_urls,
                email_delivery,
                product_name,
                mail_from,
                support_email,
                service_mail_from,
                senders,
                ..
            },
            Some(tenant),
        ) => {
            let brand = crate::branding::ServiceBrand {
                from: service_mail_from,
                from_domains: senders.mail_from_domains,
                ..Default::default()
            };
            // `""` clears; anything else is checked before anything changes.
            let given = |value: Option<String>| value.map(|v| Some(v).filter(|v| !v.is_empty()));
            let (product_name, mail_from, support_email) =
                (given(product_name), given(mail_from), given(support_email));
            if let Some(Some(name)) = &product_name {
                crate::branding::check_product_name(name)
                    .map_err(|why| anyhow::anyhow!("--product-name: {why}"))?;
            }
            if let Some(Some(from)) = &mail_from {
                brand
                    .check_from(from)
                    .map_err(|why| anyhow::anyhow!("--mail-from: {why}"))?;
            }
            let support_email = match support_email {
                Some(Some(address)) => Some(Some(
                    crate::branding::check_support_email(&address)
                        .map_err(|why| anyhow::anyhow!("--support-email: {why}"))?,
                )),
                other => other,
            };
            let branding_given =
                product_name.is_some() || mail_from.is_some() || support_email.is_some();
            let not_found = || {
                refuse(
                    Failure::NotFound,
                    format!("no tenant {tenant} (`oncely tenant list` shows them)"),
                )
            };
            if !backend
                .tenants()
                .await?
                .iter()
                .any(|t| t.id == tenant.as_str())
            {
                return Err(not_found());
            }
            // Refused before anything changes.
            if email_delivery == Some(EmailDelivery::Webhook) {
                let receives = backend
                    .webhook_endpoints(Some(tenant.as_str()))
                    .await?
                    .iter()
                    .any(|e| {
                        e.disabled_at_ms.is_none()
                            && subscribed(&e.events, EventType::EmailRequested)
                    });
                if !receives {
                    bail!(
                        "tenant {tenant} has no enabled webhook endpoint that receives email.requested: its emails would go nowhere. Add one first (`oncely tenant webhook add {tenant} URL --events email.requested`, or without --events for every event)"
                    );
                }
            }
            let urls_given = !return_urls.is_empty() || no_return_urls;
            if urls_given
                && !backend
                    .set_return_urls(tenant.as_str(), &return_urls)
                    .await?
            {
                return Err(not_found());
            }
            if let Some(how) = email_delivery
                && !backend
                    .set_email_delivery(tenant.as_str(), how.as_str())
                    .await?
            {
                return Err(not_found());
            }
            let mut branding = backend.branding(tenant.as_str()).await?;
            if branding_given {
                if let Some(name) = product_name {
                    branding.product_name = name;
                }
                if let Some(from) = mail_from {
                    branding.mail_from = from;
                }
                if let Some(address) = support_email {
                    branding.support_email = address;
                }
                if !backend.set_branding(tenant.as_str(), &branding).await? {
                    return Err(not_found());
                }
            }
            let mut value = json!({ "tenant": tenant.as_str() });
            if branding_given {
                value["product_name"] = json!(branding.product_name);
                value["mail_from"] = json!(branding.mail_from);
                value["support_email"] = json!(branding.support_email);
            }
            if urls_given {
                value["return_urls"] = json!(return_urls);
            }
            if let Some(how) = email_delivery {
                value["email_delivery"] = json!(how.as_str());
            }
            render(output, &value, |out| {
                if urls_given {
                    match return_urls.as_slice() {
                        [] => writeln!(out, "tenant {tenant} has no return URLs")?,
                        urls => writeln!(
                            out,
                            "tenant {tenant} returns to (the first by default):\n{}",
                            urls.join("\n")
                        )?,
                    }
                }
                match email_delivery {
                    Some(EmailDelivery::Webhook) => writeln!(
                        out,
                        "tenant {tenant}'s emails go to its endpoints as email.requested events: oncely mails none"
                    )?,
                    Some(EmailDelivery::Mail) => {
                        writeln!(out, "tenant {tenant}'s emails are sent by oncely")?;
                    }
                    None => {}
                }
                if branding_given {
                    let or_service = |value: &Option<String>, setting: &str| {
                        value
                            .clone()
                            .unwrap_or_else(|| format!("the service's ({setting})"))
                    };
                    writeln!(
                        out,
                        "tenant {tenant}'s emails: product name {}, from {}, support address {}",
                        or_service(&branding.product_name, "ONCELY_PRODUCT_NAME"),
                        or_service(&branding.mail_from, "ONCELY_MAIL_FROM"),
                        or_service(&branding.support_email, "ONCELY_SUPPORT_EMAIL"),
                    )?;
                }
                Ok(())
            })
        }
        (TenantCommand::List { .. }, _) => {
            let mut tenants: Vec<TenantView> = backend
                .tenants()
                .await?
                .into_iter()
                .map(TenantView::from)
                .collect();
            for (id, url) in backend.all_return_urls().await? {
                if let Some(view) = tenants.iter_mut().find(|t| t.tenant == id) {
                    view.return_urls.push(url);
                }
            }
            render(output, &tenants, |out| {
                if tenants.is_empty() {
                    writeln!(
                        out,
                        "no tenants (requests without an API key act for `default`)"
                    )?;
                    return Ok(());
                }
                let rows: Vec<Vec<String>> = tenants
                    .iter()
                    .map(|t| {
                        vec![
                            t.tenant.clone(),
                            when(t.created_at),
                            t.key_fingerprint.clone(),
                            match (&t.previous_key_fingerprint, t.previous_key_valid_until) {
                                (Some(previous), Some(until)) => {
                                    format!("{previous} until {}", when(until))
                                }
                                _ => "-".into(),
                            },
                            match t.return_urls.as_slice() {
                                [] => "-".into(),
                                urls => clean(&urls.join(" ")),
                            },
                            t.email_delivery.clone(),
                        ]
                    })
                    .collect();
                let header = [
                    "tenant",
                    "created",
                    "key (sha256)",
                    "previous key",
                    "return URLs",
                    "emails",
                ];
                for line in table(&header, &rows) {
                    writeln!(out, "{line}")?;
                }
                Ok(())
            })
        }
        (
            TenantCommand::Create { .. }
            | TenantCommand::RotateKey { .. }
            | TenantCommand::Set { .. },
            None,
        ) => {
            unreachable!("named above")
        }
        (TenantCommand::Webhook(_), _) => unreachable!("handled above"),
    }
}

// ---------------------------------------------------------------------------------------------
// oncely tenant webhook …

/// An endpoint in `tenant webhook list --json` (never a secret).
#[derive(Debug, Serialize)]
pub struct EndpointView {
    /// Its id: `disable`, `enable`, `rotate` and `remove` take it.
    pub id: Uuid,
    /// The tenant whose events it receives.
    pub tenant: String,
    /// Where they are POSTed.
    pub url: String,
    /// The event types it receives; empty: every event.
    pub events: Vec<String>,
    /// Whether it receives events.
    pub enabled: bool,
    /// When it was disabled, if it is.
    #[serde(with = "time::serde::rfc3339::option")]
    pub disabled_at: Option<OffsetDateTime>,
    /// Why: `disabled by an operator`, or `410 Gone at …`.
    pub disabled_reason: Option<String>,
    /// When it was added.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Until when its previous signing secret signs too (after `rotate`), while it does.
    #[serde(with = "time::serde::rfc3339::option")]
    pub previous_secret_valid_until: Option<OffsetDateTime>,
}

impl From<EndpointRecord> for EndpointView {
    fn from(e: EndpointRecord) -> Self {
        Self {
            id: e.id,
            tenant: e.tenant,
            url: e.url,
            events: serde_json::from_str(&e.events).unwrap_or_default(),
            enabled: e.disabled_at_ms.is_none(),
            disabled_at: e.disabled_at_ms.map(from_millis),
            disabled_reason: e.disabled_reason,
            created_at: from_millis(e.created_at_ms),
            previous_secret_valid_until: e.previous_secret_expires_at_ms.map(from_millis),
        }
    }
}

/// The reason `tenant webhook disable` records.
pub const DISABLED_BY_OPERATOR: &str = "disabled by an operator";

/// The event types of `--events`, checked, as the stored JSON array (`[]`: every event, when
/// `--events` is not given; given, it must name at least one).
pub fn webhook_events(events: &[String]) -> anyhow::Result<String> {
    use crate::webhooks::EventType;
    let mut types: Vec<&str> = Vec::new();
    for name in events.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let Some(kind) = EventType::parse(name) else {
            let valid: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
            bail!(
                "unknown event type {:?}; the event types are: {}",
                clean(name),
                valid.join(", ")
            );
        };
        if !types.contains(&kind.as_str()) {
            types.push(kind.as_str());
        }
    }
    // An empty `--events ""` (an unset shell variable) is not "every event": that would include
    // email.requested, which carries full addresses and links.
    if !events.is_empty() && types.is_empty() {
        bail!("--events names no event type; leave --events out for every event");
    }
    Ok(serde_json::to_string(&types)?)
}

/// An endpoint id from the command line; a malformed one is not found (exit 3).
fn endpoint_id(id: &str) -> anyhow::Result<Uuid> {
    id.trim().parse().map_err(|_| no_endpoint(id))
}

fn no_endpoint(id: &str) -> anyhow::Error {
    refuse(
        Failure::NotFound,
        format!(
            "no webhook endpoint {} (`oncely tenant webhook list` shows them)",
            clean(id)
        ),
    )
}

/// The server secret a webhook command seals with, resolved as `serve` resolves it.
pub(crate) async fn command_secret<B: Accounts>(
    backend: &B,
    args: &crate::cli::SecretArgs,
    database_url: &str,
) -> anyhow::Result<oncely::ServerSecret> {
    let (secret, generated) = crate::settings::server_secret(
        args.environment,
        (args.secret.as_ref(), args.secret_previous.as_ref()),
        database_url,
    )?;
    match generated {
        Some(generated) => crate::startup::development_secret(backend, &generated, &secret).await,
        None => Ok(secret),
    }
}

/// `oncely tenant webhook add|list|disable|enable|rotate|remove` on backend `B`: what to print.
pub async fn webhook<B: Accounts>(command: WebhookCommand) -> anyhow::Result<String> {
    use crate::webhooks::secret::{SigningSecret, seal};
    let output = command.output();
    // Checked before anything connects.
    let (tenant, events) = match &command {
        WebhookCommand::Add {
            name,
            events,
            url,
            webhooks,
            secrets,
            ..
        } => {
            let tenant = oncely::TenantId::parse(name).map_err(|e| anyhow::anyhow!("{e}"))?;
            webhooks
                .policy(secrets.environment)
                .check_resolved(url)
                .await
                .map_err(|e| anyhow::anyhow!("refused webhook URL: {e}"))?;
            (Some(tenant), webhook_events(events)?)
        }
        _ => (None, String::new()),
    };
    let location = command.database().location();
    let backend: B = crate::startup::open_existing(&location, COMMAND_POOL).await?;
    match command {
        WebhookCommand::Add { url, secrets, .. } => {
            let tenant = tenant.expect("parsed above");
            if tenant != oncely::TenantId::default()
                && !backend
                    .tenants()
                    .await?
                    .iter()
                    .any(|t| t.id == tenant.as_str())
            {
                return Err(refuse(
                    Failure::NotFound,
                    format!("no tenant {tenant} (`oncely tenant list` shows them)"),
                ));
            }
            let server = command_secret(&backend, &secrets, &location.url).await?;
            let id = Uuid::new_v4();
            let signing = SigningSecret::generate();
            let sealed = seal(&server, id, &signing);
            backend
                .insert_webhook_endpoint(crate::accounts::NewEndpoint {
                    id,
                    tenant: tenant.as_str(),
                    url: &url,
                    events: &events,
                    secret_sealed: &sealed,
                })
                .await?;
            let types: Vec<String> = serde_json::from_str(&events)?;
            let value = json!({
                "id": id,
                "tenant": tenant.as_str(),
                "url": url,
                "events": types,
                "secret": signing.expose(),
            });
            render(output, &value, |out| {
                writeln!(
                    out,
                    "webhook endpoint {id} added: tenant {tenant}'s {} go to {}.\nIts signing secret (shown once; stored sealed):\n{}",
                    if types.is_empty() {
                        "events".to_owned()
                    } else {
                        types.join(", ")
                    },
                    clean(&url),
                    signing.expose()
                )?;
                Ok(())
            })
        }
        WebhookCommand::List { name, .. } => {
            let endpoints: Vec<EndpointView> = backend
                .webhook_endpoints(name.as_deref())
                .await?
                .into_iter()
                .map(EndpointView::from)
                .collect();
            render(output, &endpoints, |out| {
                if endpoints.is_empty() {
                    writeln!(
                        out,
                        "no webhook endpoints (`oncely tenant webhook add` adds one)"
                    )?;
                    return Ok(());
                }
                let rows: Vec<Vec<String>> = endpoints
                    .iter()
                    .map(|e| {
                        vec![
                            e.id.to_string(),
                            e.tenant.clone(),
                            if e.events.is_empty() {
                                "all".into()
                            } else {
                                e.events.join(",")
                            },
                            match (e.disabled_at, &e.disabled_reason) {
                                (None, _) => "enabled".into(),
                                (Some(at), reason) => format!(
                                    "disabled {} ({})",
                                    when(at),
                                    clean(reason.as_deref().unwrap_or(DISABLED_BY_OPERATOR))
                                ),
                            },
                            when(e.created_at),
                            match e.previous_secret_valid_until {
                                Some(until) => format!("until {}", when(until)),
                                None => "-".into(),
                            },
                            clean(&e.url),
                        ]
                    })
                    .collect();
                let header = [
                    "id",
                    "tenant",
                    "events",
                    "state",
                    "created",
                    "previous secret",
                    "url",
                ];
                for line in table(&header, &rows) {
                    writeln!(out, "{line}")?;
                }
                Ok(())
            })
        }
        WebhookCommand::Disable { id, .. } => {
            let uuid = endpoint_id(&id)?;
            if !backend
                .set_webhook_disabled(uuid, Some(DISABLED_BY_OPERATOR))
                .await?
            {
                return Err(no_endpoint(&id));
            }
            let value = json!({ "id": uuid, "enabled": false });
            render(output, &value, |out| {
                writeln!(
                    out,
                    "webhook endpoint {uuid} disabled: it gets no new events, and its pending deliveries end dead"
                )?;
                Ok(())
            })
        }
        WebhookCommand::Enable { id, .. } => {
            let uuid = endpoint_id(&id)?;
            if !backend.set_webhook_disabled(uuid, None).await? {
                return Err(no_endpoint(&id));
            }
            let value = json!({ "id": uuid, "enabled": true });
            render(output, &value, |out| {
                writeln!(
                    out,
                    "webhook endpoint {uuid} enabled (`oncely outbox retry` re-drives deliveries that went dead meanwhile)"
                )?;
                Ok(())
            })
        }
        WebhookCommand::Rotate {
            id, grace, secrets, ..
        } => {
            let uuid = endpoint_id(&id)?;
            if backend.webhook_endpoint(uuid).await?.is_none() {
                return Err(no_endpoint(&id));
            }
            let server = command_secret(&backend, &secrets, &location.url).await?;
            let signing = SigningSecret::generate();
            let sealed = seal(&server, uuid, &signing);
            let grace = grace.unwrap_or(crate::cli::WEBHOOK_GRACE);
            let Some(rotated) = backend.rotate_webhook_secret(uuid, &sealed, grace).await? else {
                return Err(no_endpoint(&id));
            };
            let until = rotated.previous_valid_until;
            let value = json!({
                "id": uuid,
                "secret": signing.expose(),
                "previous_secret_valid_until": until.map(rfc3339),
            });
            render(output, &value, |out| {
                let old = match until {
                    Some(at) => format!("keeps signing beside it until {}", when(at)),
                    None => "no longer signs".to_owned(),
                };
                writeln!(
                    out,
                    "webhook endpoint {uuid} has a new signing secret; the previous one {old}. The new secret (shown once; stored sealed):\n{}",
                    signing.expose()
                )?;
                Ok(())
            })
        }
        WebhookCommand::Remove { id, .. } => {
            let uuid = endpoint_id(&id)?;
            if !backend.remove_webhook_endpoint(uuid).await? {
                return Err(no_endpoint(&id));
            }
            let value = json!({ "id": uuid, "removed": true });
            render(output, &value, |out| {
                writeln!(
                    out,
                    "webhook endpoint {uuid} removed (its pending deliveries end dead)"
                )?;
                Ok(())
            })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// oncely key show

/// `oncely key show --json`.
#[derive(Debug, Serialize)]
pub struct KeyView {
    /// The tenant.
    pub tenant: String,
    /// The method.
    pub method: String,
    /// The route template.
    pub route: String,
    /// The key.
    pub key: String,
    /// `in_progress`, `completed` or `tombstoned`.
    pub state: &'static str,
    /// For `in_progress`: whether its lease still runs (else the next retry takes it over).
    pub lease_active: Option<bool>,
    /// The request's fingerprint (HMAC-SHA256), 64 hex digits.
    pub fingerprint: String,
    /// When its retention ends: then the key is free again.
    #[serde(with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
    /// For `completed`: what it replays.
    pub response: Option<ResponseView>,
    /// For `tombstoned`: why.
    pub tombstone_reason: Option<String>,
}

/// The answer a completed key replays.
#[derive(Debug, Serialize)]
pub struct ResponseView {
    /// The status.
    pub status: u16,
    /// The replayed headers, `[name, value]` pairs.
    pub headers: Vec<(String, String)>,
    /// The body, as text (invalid UTF-8 replaced).
    pub body: String,
}

/// `oncely key show`: the state of one idempotency key, and the answer it replays. A key that
/// is not there (never used, or past its retention) is [`Failure::NotFound`].
pub async fn key_show<B: Accounts>(command: KeyCommand) -> anyhow::Result<String> {
    use oncely::store::{KeyStore, RecordState};
    use oncely::{IdempotencyKey, Scope, TenantId};
    let KeyCommand::Show {
        key,
        route,
        method,
        tenant,
        database,
        output,
    } = command;
    let tenant = TenantId::parse(tenant).map_err(|e| anyhow::anyhow!("{e}"))?;
    let key = IdempotencyKey::parse(&key).map_err(|e| anyhow::anyhow!("{e}"))?;
    let scope = Scope::new(tenant, method.to_uppercase(), route, key);
    let backend: B = crate::startup::open_existing(&database.location(), COMMAND_POOL).await?;
    let title = format!(
        "tenant {} · {} {} · key {:?}",
        scope.tenant,
        clean(&scope.method),
        clean(&scope.route),
        scope.key.as_str()
    );
    let Some(record) = backend.keys().get(&scope).await? else {
        return Err(refuse(
            Failure::NotFound,
            format!(
                "{title}: not found: never used, or its retention has passed (a request with it \
                 runs afresh)"
            ),
        ));
    };
    let (state, lease_active, response, tombstone_reason) = match record.state {
        RecordState::InProgress { lease_active } => ("in_progress", Some(lease_active), None, None),
        RecordState::Completed(response) => (
            "completed",
            None,
            Some(ResponseView {
                status: response.status,
                headers: response.headers,
                body: String::from_utf8_lossy(&response.body).into_owned(),
            }),
            None,
        ),
        RecordState::Tombstoned { reason } => ("tombstoned", None, None, Some(reason)),
    };
    let view = KeyView {
        tenant: scope.tenant.to_string(),
        method: scope.method.clone(),
        route: scope.route.clone(),
        key: scope.key.as_str().to_owned(),
        state,
        lease_active,
        fingerprint: hex::encode(record.fingerprint.as_bytes()),
        expires_at: record.expires_at.map(OffsetDateTime::from),
        response,
        tombstone_reason,
    };
    render(output, &view, |out| {
        writeln!(out, "{title}")?;
        match (&view.response, view.lease_active, &view.tombstone_reason) {
            (Some(response), _, _) => {
                writeln!(out, "state: completed; replays status {}", response.status)?;
            }
            (_, Some(true), _) => writeln!(out, "state: in progress (lease running)")?,
            (_, Some(false), _) => writeln!(
                out,
                "state: in progress, lease expired (the next retry takes it over)"
            )?,
            (_, _, reason) => writeln!(
                out,
                "state: tombstoned ({})",
                clean(reason.as_deref().unwrap_or_default())
            )?,
        }
        writeln!(out, "fingerprint: {}", view.fingerprint)?;
        writeln!(
            out,
            "expires: {} (then the key is free again)",
            when_or_dash(view.expires_at)
        )?;
        if let Some(response) = &view.response {
            for (name, value) in &response.headers {
                writeln!(out, "  {}: {}", clean(name), clean(value))?;
            }
            writeln!(out, "  body: {}", clean(&response.body))?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// oncely prune, oncely migrate

/// `oncely prune`: a full pass (with a progress spinner on a terminal's stderr, none with
/// `--json`), and what it deleted.
pub async fn prune<B: Accounts>(args: PruneArgs) -> anyhow::Result<String> {
    use indicatif::{ProgressBar, ProgressStyle};
    let backend: B = crate::startup::open_existing(&args.database.location(), COMMAND_POOL).await?;
    let bar = if args.output.json {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} pruning {msg}").expect("a valid template"),
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    };
    let progress = |table: &str, n: u64| bar.set_message(format!("{table}: {n} rows deleted"));
    let retention =
        crate::prune::Retention::new(args.retention.outbox_retention, args.retention.cap_window());
    let pruned =
        crate::prune::prune_all(&backend, &backend.jobs(true), retention, progress).await?;
    bar.finish_and_clear();
    let value = json!({
        "keys": pruned.keys,
        "jobs": pruned.jobs,
        "tokens": pruned.tokens,
        "rate_limits": pruned.rate_limits,
        "total": pruned.total(),
    });
    render(args.output, &value, |out| {
        writeln!(
            out,
            "pruned {} rows: {} idempotency keys, {} outbox jobs, {} tokens, {} email-cap counters",
            pruned.total(),
            pruned.keys,
            pruned.jobs,
            pruned.tokens,
            pruned.rate_limits
        )?;
        Ok(())
    })
}

/// What `oncely migrate` prints: per library what it applied (`outbox 1 applied, schema at
/// 0007`), or with `--json` `{"database": "postgres", "applied": n, "libraries":
/// [{"library": "outbox", "applied": 1, "schema": "0007", "unknown": 0}, …]}` (`unknown`:
/// migrations a newer release applied that this binary does not know).
pub fn migrated<B: Backend>(
    migrated: &crate::startup::Migrated,
    output: OutputArgs,
) -> anyhow::Result<String> {
    let libraries: Vec<Value> = migrated
        .libraries()
        .map(|(applied, after)| {
            json!({
                "library": after.library,
                "applied": applied,
                "schema": crate::startup::version_name(after.at),
                "unknown": after.unknown,
            })
        })
        .collect();
    let value = json!({
        "database": B::NAME,
        "applied": migrated.applied(),
        "libraries": libraries,
    });
    render(output, &value, |out| {
        write!(out, "{migrated}")?;
        Ok(())
    })
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
        let args = redrive_args(&filter, 2);
        let printed = shell_command(&args);
        let words = shlex::split(&printed).expect("a shell can split it");
        assert_eq!(words[1..], args, "the shell line and the arguments agree");
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

    /// Issue 15, item 5: fixed widths cut long keys and misaligned the rest.
    #[test]
    fn table_columns_fit_their_widest_cell() {
        let long = "verification:default:0123456789abcdef0123456789abcdef0123456789";
        let lines = table(
            &["id", "operation key", "error"],
            &[
                vec!["7".into(), long.into(), "boom".into()],
                vec!["12345".into(), "k".into(), String::new()],
            ],
        );
        assert_eq!(
            lines[0],
            format!("id     operation key{}  error", " ".repeat(long.len() - 13))
        );
        assert_eq!(lines[1], format!("7      {long}  boom"));
        assert_eq!(lines[2], "12345  k", "no trailing spaces");
    }

    /// A provider's error text reaches the operator's terminal: no escape sequences, one line.
    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(
            clean("550 no\r\n\u{1b}[31mred"),
            "550 no\\r\\n\\u{1b}[31mred"
        );
    }

    /// Regression (review of issue 17): `--events ""` (an unset shell variable) subscribed the
    /// endpoint to every event, email.requested's addresses and links included.
    #[test]
    fn events_given_must_name_an_event_type() {
        let list = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(webhook_events(&[]).unwrap(), "[]", "not given: every event");
        assert!(webhook_events(&list(&[""])).is_err());
        assert!(webhook_events(&list(&["", " "])).is_err());
        assert_eq!(
            webhook_events(&list(&["user.created", "", "user.created"])).unwrap(),
            r#"["user.created"]"#
        );
        assert!(webhook_events(&list(&["user.deleted"])).is_err());
    }
}
