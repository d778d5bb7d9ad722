//! `oncely outbox list|dead|show|retry|unknown|settle`: inspect outbox jobs and re-drive
//! dead ones (one, or in bulk with a dry run that prints the exact command).

use std::fmt::Write;

use anyhow::bail;
use clap::ArgGroup;
use clap::Args;
use clap::Subcommand;
use clap::ValueEnum;
use oncely_outbox::JobRecord;
use oncely_outbox::JobStatus;
use oncely_outbox::JobStore;
use oncely_outbox::Settlement;
use oncely_outbox::job::AttemptRecord;
use oncely_outbox::store::BulkRedrive;
use oncely_outbox::store::DeadFilter;
use oncely_outbox::store::JobFilter;
use oncely_outbox::store::PROVIDER_DEDUPE_WINDOW;
use oncely_server::accounts::Accounts;
use oncely_server::backend::COMMAND_POOL;
use oncely_server::display::when;
use serde::Serialize;
use serde_json::json;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::args::DatabaseArgs;
use crate::args::parse_since;
use crate::commands::OperatorArgs;
use crate::output::Failure;
use crate::output::OutputArgs;
use crate::output::clean;
use crate::output::refuse;
use crate::output::render;
use crate::output::render_line;
use crate::output::table;
use crate::output::when_or_dash;

/// `oncely outbox …`.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// List jobs, newest first.
    List {
        /// Only this kind (`email.verification`, `charge`, …).
        #[arg(long)]
        kind: Option<String>,
        /// Only this status.
        #[arg(long, value_parser = job_status())]
        status: Option<JobStatus>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// List dead jobs — real failures — with their reasons (`list --status dead`; skipped jobs
    /// are `list --status skipped`).
    Dead(StatusListArgs),
    /// List parked jobs (`list --status unknown`): jobs of a kind that reconciles unknown
    /// outcomes (`--on-unknown reconcile`) whose attempt may or may not have reached the
    /// provider. Nothing more is sent for them until they are settled (`outbox settle`).
    Unknown(StatusListArgs),
    /// Settle a parked job, once you know whether the provider accepted it (its log, its
    /// dashboard, the recipient): --sent records it sent (a worker of its kind records it
    /// without sending, with its follow-up events); --resend sends it again, under the same
    /// delivery key and payload, with a fresh attempt budget and horizon.
    #[command(group(ArgGroup::new("settlement").required(true).args(["sent", "resend"])))]
    Settle {
        /// The job: its operation key, or its id (what `unknown` prints first).
        job: String,
        /// Read JOB only as this (when a number is both an operation key and another job's id).
        #[arg(long, value_enum)]
        by: Option<JobRefKind>,
        /// The provider accepted it.
        #[arg(long)]
        sent: bool,
        /// The provider did not accept it: send it again.
        #[arg(long)]
        resend: bool,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// Show a job and every attempt of its life: when each started and ended, numbered across
    /// re-drives, and where a re-drive happened.
    Show {
        /// The job: its operation key, or its id (what `list` prints first).
        job: String,
        /// Read JOB only as this (when a number is both an operation key and another job's id).
        #[arg(long, value_enum)]
        by: Option<JobRefKind>,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// Re-drive dead jobs: one by its operation key (at once), or every dead job that matches
    /// all of --kind, --since, --until and --reason-like given (a dry run unless --yes). A
    /// re-driven job is due now, with a fresh attempt budget and retry horizon and its same
    /// delivery key.
    ///
    /// The dry run prints how many dead jobs match, a sample of their keys and last errors,
    /// how many of them had an attempt with an unknown outcome more than 24 h ago, and the
    /// command that re-drives exactly those: with absolute times (--since as given,
    /// --until the dry run's moment) and --expect the count, so that a job that dies after the
    /// dry run is never re-driven and any other change makes it refuse.
    ///
    /// The provider deduplicates that key only inside its window (about 24 h from the key's
    /// first use): a job whose earlier attempt had an unknown outcome may have been delivered,
    /// and re-driving it after that window may deliver a second copy.
    #[command(group(
        ArgGroup::new("which")
            .required(true)
            .multiple(true)
            .args(["key", "kind", "since", "until", "reason_like"])
    ))]
    Retry {
        /// The job (its operation key, or its id): re-drives that one job at once, if it is
        /// dead. Without it, the filters choose (at least one).
        #[arg(
            value_name = "JOB",
            conflicts_with_all = ["kind", "since", "until", "reason_like", "expect"]
        )]
        key: Option<String>,
        /// Read JOB only as this (when a number is both an operation key and another job's id).
        #[arg(long, value_enum, requires = "key")]
        by: Option<JobRefKind>,
        /// Only dead jobs of this kind.
        #[arg(long)]
        kind: Option<String>,
        /// Only jobs that died at or after this moment: an RFC 3339 time
        /// (`2025-01-31T08:00:00Z`) or a duration ago (`2h`, `30m`, `1d`).
        #[arg(long, value_parser = parse_since)]
        since: Option<OffsetDateTime>,
        /// Only jobs that died at or before this moment, in the same forms as --since. The dry
        /// run prints its own moment here, so that jobs that die after it are left out.
        #[arg(long, value_parser = parse_since)]
        until: Option<OffsetDateTime>,
        /// Only jobs whose last error contains this text, ignoring case: a plain substring
        /// (`401`, `invalid api key`), not a pattern (`%` and `_` are themselves).
        #[arg(long)]
        reason_like: Option<String>,
        /// With --yes: re-drive only if exactly this many dead jobs match at that moment;
        /// otherwise change nothing and fail. The count and the re-drive are one transaction.
        #[arg(long, requires = "yes")]
        expect: Option<u64>,
        /// Re-drive the matching jobs. Without it: a dry run that changes nothing and prints
        /// the count, a sample and the exact command to run.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
}

impl OutboxCommand {
    /// Where the jobs are, and how it prints.
    pub fn operator(&self) -> &OperatorArgs {
        match self {
            Self::List { operator, .. }
            | Self::Settle { operator, .. }
            | Self::Show { operator, .. }
            | Self::Retry { operator, .. } => operator,
            Self::Dead(args) | Self::Unknown(args) => &args.operator,
        }
    }

    /// Where the jobs are.
    pub fn database(&self) -> &DatabaseArgs {
        &self.operator().database
    }

    /// How it prints.
    pub fn output(&self) -> OutputArgs {
        self.operator().output
    }
}

/// `outbox dead` and `outbox unknown`: `outbox list` of one status.
#[derive(Debug, Args)]
pub struct StatusListArgs {
    /// Only this kind.
    #[arg(long)]
    pub kind: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub operator: OperatorArgs,
}

impl StatusListArgs {
    /// The `outbox list` it stands for.
    pub fn list(self, status: JobStatus) -> OutboxCommand {
        OutboxCommand::List {
            kind: self.kind,
            status: Some(status),
            limit: self.limit,
            operator: self.operator,
        }
    }
}

/// `--status`: every [`JobStatus`] the outbox knows, by its stored name.
pub(crate) fn job_status() -> impl clap::builder::TypedValueParser<Value = JobStatus> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(JobStatus::ALL.map(JobStatus::as_str))
        .map(|s: String| JobStatus::parse(&s).expect("the parser offers only the statuses' names"))
}

/// How `outbox show` and `outbox retry` read their JOB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JobRefKind {
    /// An operation key.
    Key,
    /// A job id.
    Id,
}

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
pub(crate) fn masked_payload(payload: &serde_json::Value) -> serde_json::Value {
    let mut shown = payload.clone();
    if let Some(to) = payload.get("recipient").and_then(|to| to.as_str()) {
        shown["recipient"] = oncely_server::email::masked(to).into();
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
pub(crate) fn redriven_since(redriven_at: Option<OffsetDateTime>, history: &[AttemptView]) -> bool {
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
        oncely_server::startup::open_existing(&command.database().location(), COMMAND_POOL).await?;
    run_outbox_command(&backend.jobs(true), command).await
}

pub(crate) async fn run_outbox_command<S: JobStore>(
    jobs: &S,
    command: OutboxCommand,
) -> anyhow::Result<String> {
    let output = command.output();
    match command {
        OutboxCommand::Dead(_) | OutboxCommand::Unknown(_) => {
            unreachable!("`outbox` turns it into a list")
        }
        OutboxCommand::Settle { job, by, sent, .. } => {
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
        OutboxCommand::Show { job, by, .. } => {
            let job = find_job(jobs, &job, by).await?;
            let view = ShowView::new(&job, jobs.attempts(job.id).await?);
            render(output, &view, |out| show(&view, out))
        }
        OutboxCommand::Retry {
            key: Some(key), by, ..
        } => redrive_one(jobs, &key, by, output).await,
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
                redrive_dead(jobs, &filter, expect, output).await
            } else {
                dry_run(jobs, &filter, output).await
            }
        }
    }
}

/// The human `outbox list`: one row per job.
pub(crate) fn list_table(jobs: &[JobView], out: &mut String) -> anyhow::Result<()> {
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
pub(crate) fn show(view: &ShowView, out: &mut String) -> anyhow::Result<()> {
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
pub(crate) async fn find_job<S: JobStore>(
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
pub(crate) async fn redrive_one<S: JobStore>(
    jobs: &S,
    job: &str,
    by: Option<JobRefKind>,
    output: OutputArgs,
) -> anyhow::Result<String> {
    let found = find_job(jobs, job, by).await?;
    let key = &found.operation_key;
    if jobs.redrive(key).await? {
        let value = json!({ "id": found.id, "operation_key": key, "redriven": true });
        return render_line(
            output,
            &value,
            format_args!(
                "re-driven: {} (job {}) is due now, with a fresh attempt budget and horizon and \
                 the same delivery key",
                clean(key),
                found.id
            ),
        );
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
pub(crate) async fn settle_one<S: JobStore>(
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
pub(crate) const DRY_RUN_SAMPLE: u32 = 10;

/// `oncely outbox retry --kind … --since … --reason-like … --yes [--expect N]`: re-drives the
/// matching dead jobs, or with `expect` refuses (changing nothing) unless exactly that many
/// match.
pub(crate) async fn redrive_dead<S: JobStore>(
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
pub(crate) struct DryRunView {
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
pub(crate) struct SampleView {
    operation_key: String,
    last_error: Option<String>,
}

/// `oncely outbox retry --kind … --since … --reason-like …` without `--yes`: how many dead jobs
/// match, a sample, how many the provider may no longer deduplicate, and the command that
/// re-drives exactly those.
pub(crate) async fn dry_run<S: JobStore>(
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
pub(crate) fn redrive_args(filter: &DeadFilter, expect: i64) -> Vec<String> {
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
pub(crate) fn shell_command(args: &[String]) -> String {
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
pub(crate) fn rfc3339(at: OffsetDateTime) -> String {
    at.to_offset(time::UtcOffset::UTC)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| at.to_string())
}

/// The filters of a bulk re-drive, in words.
pub(crate) fn describe(filter: &DeadFilter) -> String {
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
}
