//! The command line: flags with environment fallbacks (clap types only). What they resolve to,
//! checked once, is [`crate::settings`]. Secrets never print.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use oncely_outbox::mail::IdempotencyHeader;
use oncely_outbox::{JobStatus, OnUnknown};
use secrecy::SecretString;
use time::OffsetDateTime;

use crate::settings::{Environment, defaults};

/// `oncely`: retried requests and re-run jobs become harmless.
#[derive(Debug, Parser)]
#[command(name = "oncely", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP API (and, unless `--workers 0`, outbox workers in the same process).
    Serve(Box<ServeArgs>),
    /// Run outbox workers only.
    Worker(WorkerArgs),
    /// Apply the database migrations and exit.
    Migrate(MigrateArgs),
    /// Run the test inbox: SMTP and a Resend-compatible HTTP API that keep every message.
    Inbox(InboxArgs),
    /// Manage tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Check the emails' templates, and preview a message as it would be sent.
    #[command(subcommand)]
    Templates(TemplatesCommand),
    /// Inspect outbox jobs and re-drive dead ones.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Delete expired keys, old outbox history, expired tokens and old email-cap counters, in
    /// small batches (safe while serving).
    Prune(PruneArgs),
    /// Run a storm of retried, concurrent and conflicting signups against an embedded instance,
    /// and show that every intent made one account and one email.
    Demo {
        /// How many intents (signups for distinct addresses).
        #[arg(long, default_value_t = 10)]
        intents: usize,
        /// Show the embedded service's log lines here (otherwise they go to a file, named at
        /// the start).
        #[arg(short, long)]
        verbose: bool,
    },
    /// Look up idempotency keys (for a support case).
    #[command(subcommand)]
    Key(KeyCommand),
    /// Check any API against the Idempotency-Key contract: missing and malformed keys, the
    /// first request, its replay (status, body, `Idempotent-Replayed`), the same key with
    /// another body (422), the key on another route, concurrent duplicates (one execution),
    /// `Retry-After` on 409 and 503. Prints one row per part of the contract — pass, fail or n/a, with
    /// its evidence — and exits 1 if any row fails (docs/check.md).
    Check(CheckArgs),
    /// Put the Idempotency-Key contract in front of an HTTP application written in anything:
    /// a reverse proxy that protects the routes you name and passes everything else through.
    Gateway(Box<GatewayArgs>),
}

impl Command {
    /// Whether the command was asked for JSON (`--json`): then its output is one JSON document
    /// on stdout, and a failure one JSON line on stderr.
    pub fn json(&self) -> bool {
        match self {
            Self::Migrate(args) => args.output.json,
            Self::Tenant(command) => command.output().json,
            Self::Templates(TemplatesCommand::Check { output, .. }) => output.json,
            Self::Templates(TemplatesCommand::Preview(_)) => false,
            Self::Outbox(command) => command.output().json,
            Self::Prune(args) => args.output.json,
            Self::Key(KeyCommand::Show { output, .. }) => output.json,
            Self::Check(args) => args.json,
            Self::Inbox(args) => {
                matches!(&args.command, Some(InboxCommand::Expect(expect)) if expect.json)
            }
            Self::Serve(_) | Self::Worker(_) | Self::Demo { .. } | Self::Gateway(_) => false,
        }
    }
}

/// `oncely check URL`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The idempotent route to check (`http://` or `https://`), e.g.
    /// `http://localhost:8080/v1/signup`. Every row sends a fresh key, `oncely-check-<uuid>`.
    #[arg(value_name = "URL", value_parser = parse_http_url)]
    pub url: url::Url,
    /// The route's method.
    #[arg(long, default_value = "POST", value_parser = parse_method)]
    pub method: http::Method,
    /// A sample body that the route accepts. `{{unique}}` in it is replaced by a fresh random
    /// string for every row (so a signup's address is new each time); sent as
    /// `application/json` if it is JSON, unless -H names a Content-Type.
    #[arg(long, value_name = "BODY", conflicts_with = "body_file")]
    pub body: Option<String>,
    /// Read the sample body from this file (as --body).
    #[arg(long, value_name = "PATH", value_parser = read_body_file)]
    pub body_file: Option<String>,
    /// A header sent with every request and the probe, `Name: value` (repeatable), e.g.
    /// `-H 'Authorization: Bearer …'`. Its value is never printed.
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE", value_parser = parse_header)]
    pub headers: Vec<oncely_check::Header>,
    /// Another idempotent route: the first request's key, sent there, must not get the first
    /// route's stored answer (without it the key-per-route row is n/a).
    #[arg(long, value_name = "URL", value_parser = parse_http_url)]
    pub other_url: Option<url::Url>,
    /// The body for --other-url (`{{unique}}` as in --body); default: the sample body.
    #[arg(long, value_name = "BODY", requires = "other_url")]
    pub other_body: Option<String>,
    /// A GET whose body counts the route's executions — a number, `{"count": n}`, a JSON
    /// object's numbers (`{"rows": 3, "emails": 3}`) or a JSON array (e.g.
    /// `http://localhost:3000/payments/count`): the concurrent row then checks that the burst
    /// grew the counts by exactly one. Without it, that row compares the answers.
    #[arg(long, value_name = "URL", value_parser = parse_http_url)]
    pub probe: Option<url::Url>,
    /// How many identical requests the concurrent row sends at once (2–100).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(2..=100))]
    pub concurrency: u16,
    /// How long one request may take (`10s`, `500ms`).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Print one JSON document on stdout: every row with its verdict and evidence, and the
    /// counts (docs/check.md). The exit codes stay the same.
    #[arg(long)]
    pub json: bool,
}

impl From<CheckArgs> for oncely_check::CheckConfig {
    fn from(args: CheckArgs) -> Self {
        Self {
            url: args.url,
            method: args.method,
            body: args.body.or(args.body_file),
            headers: args.headers,
            other_url: args.other_url,
            other_body: args.other_body,
            probe: args.probe,
            concurrency: usize::from(args.concurrency),
            timeout: args.timeout,
        }
    }
}

fn parse_header(text: &str) -> Result<oncely_check::Header, String> {
    text.parse()
}

fn parse_http_url(text: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(text).map_err(|e| format!("not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err("expected an http:// or https:// URL with a host".into());
    }
    Ok(url)
}

fn parse_method(text: &str) -> Result<http::Method, String> {
    http::Method::from_bytes(text.to_ascii_uppercase().as_bytes())
        .map_err(|_| format!("`{text}` is not an HTTP method"))
}

fn read_body_file(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))
}

/// `oncely templates …`.
#[derive(Debug, Subcommand)]
pub enum TemplatesCommand {
    /// Render every template of every tenant folder and locale with sample data, and check
    /// each: syntax, unknown variables, well-formed HTML, the link in both parts. Each problem
    /// is one line `file:line: reason`; exit 1 if there is any (`serve` and `worker` refuse to
    /// start on the same problems).
    Check {
        /// The templates' directory (docs/emails.md); without it, the embedded templates.
        #[arg(long, env = "ONCELY_TEMPLATES", value_name = "DIR", value_parser = parse_templates_dir)]
        dir: Option<std::path::PathBuf>,
        /// Where the tenants are: each tenant folder must name one (if the database cannot be
        /// opened, the folders are not checked, and the output says so).
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
    /// Render one message as it would be sent, with a sample recipient and link: the tenant's
    /// folder and locale (with the fallbacks), its branding from the database (`default`: the
    /// service's, ONCELY_PRODUCT_NAME …).
    Preview(Box<PreviewArgs>),
}

/// `oncely templates preview`.
#[derive(Debug, Args)]
pub struct PreviewArgs {
    /// The message: verification, password_reset, magic_link, invite, email_change,
    /// signup_notice, email_change_notice or email_taken_notice.
    pub message: String,
    /// Whose templates and branding.
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// The locale (BCP 47), as a request would ask for it.
    #[arg(long)]
    pub locale: Option<String>,
    /// What to write: the whole message (`eml`, as sent over SMTP: open it in a mail
    /// client) or one part.
    #[arg(long, value_enum, default_value = "eml")]
    pub part: PreviewPart,
    /// Write to this file instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
    /// The templates' directory; without it, the embedded templates.
    #[arg(long, env = "ONCELY_TEMPLATES", value_name = "DIR", value_parser = parse_templates_dir)]
    pub dir: Option<std::path::PathBuf>,
    /// The base of the sample link (as ONCELY_PUBLIC_URL). Default: `http://127.0.0.1:8080`.
    #[arg(long, env = "ONCELY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// The service's sender.
    #[arg(long = "mail-from", env = "ONCELY_MAIL_FROM", default_value = defaults::MAIL_FROM)]
    pub mail_from: String,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub brand: BrandArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseArgs,
}

/// Which part `oncely templates preview` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PreviewPart {
    /// The whole message, MIME (`multipart/alternative`), as sent over SMTP.
    Eml,
    /// The subject line.
    Subject,
    /// The text part.
    Text,
    /// The HTML part (open it in a browser).
    Html,
}

/// How an operator command prints.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct OutputArgs {
    /// Print exactly one JSON document on stdout, for scripts (an array for lists); a failure
    /// prints one JSON object on stderr instead. Field names and exit codes:
    /// docs/operations.md.
    #[arg(long)]
    pub json: bool,
}

/// Settings of `oncely migrate`.
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub output: OutputArgs,
}

/// `oncely key …`.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Show where a key stands: in progress, completed (with the stored answer) or tombstoned.
    Show {
        /// The key, as the client sent it (without sf-string quotes).
        key: String,
        /// The route template.
        #[arg(long, default_value = "/v1/signup")]
        route: String,
        /// The method.
        #[arg(long, default_value = "POST")]
        method: String,
        /// The tenant.
        #[arg(long, default_value = "default")]
        tenant: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
}

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
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
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
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
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
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
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
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
}

impl OutboxCommand {
    /// Where the jobs are.
    pub fn database(&self) -> &DatabaseArgs {
        match self {
            Self::List { database, .. }
            | Self::Settle { database, .. }
            | Self::Show { database, .. }
            | Self::Retry { database, .. } => database,
            Self::Dead(args) | Self::Unknown(args) => &args.database,
        }
    }

    /// How it prints.
    pub fn output(&self) -> OutputArgs {
        match self {
            Self::List { output, .. }
            | Self::Settle { output, .. }
            | Self::Show { output, .. }
            | Self::Retry { output, .. } => *output,
            Self::Dead(args) | Self::Unknown(args) => args.output,
        }
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
    pub database: DatabaseArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub output: OutputArgs,
}

impl StatusListArgs {
    /// The `outbox list` it stands for.
    pub fn list(self, status: JobStatus) -> OutboxCommand {
        OutboxCommand::List {
            kind: self.kind,
            status: Some(status),
            limit: self.limit,
            database: self.database,
            output: self.output,
        }
    }
}

/// `--on-unknown`: `resend` or `reconcile`.
fn on_unknown() -> impl clap::builder::TypedValueParser<Value = OnUnknown> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([OnUnknown::Resend, OnUnknown::Reconcile].map(OnUnknown::as_str))
        .map(|s: String| OnUnknown::parse(&s).expect("the parser offers only the policies' names"))
}

/// `--status`: every [`JobStatus`] the outbox knows, by its stored name.
fn job_status() -> impl clap::builder::TypedValueParser<Value = JobStatus> {
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

/// `oncely tenant …`.
#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its API key (once: only its hash is stored).
    Create {
        /// The tenant's id: 1-128 characters of A-Z a-z 0-9 - _ . : (not `default`).
        name: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
    /// List tenants: name, created, the fingerprint of each valid key (never a key), and the
    /// return URLs.
    List {
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
    /// Give a tenant a new API key and print it (once). The old key stops working at once, or
    /// with --grace when that period ends (one previous key at a time: a rotation within a
    /// grace period ends the older key's).
    RotateKey {
        /// The tenant's id.
        name: String,
        /// Keep the old key working this long (`1h`, `30m`, at most `30d`), while clients move
        /// to the new one. Default: it stops at once.
        #[arg(long, value_parser = parse_grace)]
        grace: Option<Duration>,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
    /// Set a tenant's return URLs (where its links send the browser back, with a one-time code
    /// its backend exchanges: `POST /v1/exchange`; the list is replaced, the first is the
    /// default of requests that name none), how its emails go out (`--email-delivery`), and
    /// its emails' branding (`--product-name`, `--mail-from`, `--support-email`; docs/emails.md).
    /// At least one of them.
    #[command(group(
        clap::ArgGroup::new("what")
            .required(true)
            .multiple(true)
            .args(["return_urls", "no_return_urls", "email_delivery", "product_name", "mail_from", "support_email"])
    ))]
    Set {
        /// The tenant's id (not `default`: it has no API key to exchange codes with).
        name: String,
        /// A return URL (repeat for several, in order): https (http only for localhost,
        /// 127.0.0.0/8 or [::1]), no user info, no fragment, written canonically.
        #[arg(
            long = "return-url",
            value_name = "URL",
            conflicts_with = "no_return_urls"
        )]
        return_urls: Vec<String>,
        /// Clear the list: links return nowhere, as before.
        #[arg(long)]
        no_return_urls: bool,
        /// How the tenant's emails go out: `mail` (oncely sends them, the default) or `webhook`
        /// (oncely sends none: each is an `email.requested` event to the tenant's endpoints,
        /// for the application to send). `webhook` needs an enabled endpoint that receives
        /// `email.requested` (explicitly or by receiving every event).
        #[arg(long, value_enum, value_name = "HOW")]
        email_delivery: Option<EmailDelivery>,
        /// The product name the tenant's emails show (`""`: the service's, ONCELY_PRODUCT_NAME).
        #[arg(long, value_name = "NAME")]
        product_name: Option<String>,
        /// The sender of the tenant's emails, `"Name <address>"` or an address, on a domain the
        /// mailer may send as (ONCELY_MAIL_FROM's or one of ONCELY_MAIL_FROM_DOMAINS); `""`: the
        /// service's, ONCELY_MAIL_FROM.
        #[arg(long, value_name = "SENDER")]
        mail_from: Option<String>,
        /// Where the tenant's users write with questions: shown in its emails, and their
        /// Reply-To (`""`: the service's, ONCELY_SUPPORT_EMAIL).
        #[arg(long, value_name = "ADDRESS")]
        support_email: Option<String>,
        /// The service's sender: a tenant's must share its domain (or one of
        /// ONCELY_MAIL_FROM_DOMAINS).
        #[arg(long = "service-mail-from", env = "ONCELY_MAIL_FROM", default_value = defaults::MAIL_FROM, hide = true)]
        service_mail_from: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        senders: SenderArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
    /// Manage the tenant's webhook endpoints: where its events go, signed.
    #[command(subcommand)]
    Webhook(WebhookCommand),
}

/// How a tenant's emails go out (`oncely tenant set --email-delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmailDelivery {
    /// oncely sends them (the mailer).
    Mail,
    /// oncely hands each to the tenant's endpoints as an `email.requested` event.
    Webhook,
}

impl EmailDelivery {
    /// As stored (`oncely_tenants.email_delivery`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mail => "mail",
            Self::Webhook => "webhook",
        }
    }
}

impl TenantCommand {
    /// Where the tenants are.
    pub fn database(&self) -> &DatabaseArgs {
        match self {
            Self::Create { database, .. }
            | Self::List { database, .. }
            | Self::RotateKey { database, .. }
            | Self::Set { database, .. } => database,
            Self::Webhook(command) => command.database(),
        }
    }

    /// How it prints.
    pub fn output(&self) -> OutputArgs {
        match self {
            Self::Create { output, .. }
            | Self::List { output, .. }
            | Self::RotateKey { output, .. }
            | Self::Set { output, .. } => *output,
            Self::Webhook(command) => command.output(),
        }
    }
}

/// The server secret, for commands that seal or unseal webhook signing secrets: resolved as
/// `serve` resolves it (development without `ONCELY_SECRET`: the database's stored secret;
/// production: `ONCELY_SECRET`, required). Its `Debug` shows no secret.
#[derive(Clone, Args)]
pub struct SecretArgs {
    /// `development` or `production` (production: `ONCELY_SECRET` is required, webhook URLs
    /// must be https and public).
    #[arg(
        long = "env",
        env = "ONCELY_ENV",
        value_enum,
        default_value = "development"
    )]
    pub environment: Environment,
    /// The server secret (as `serve`'s).
    #[arg(long, env = "ONCELY_SECRET", hide_env_values = true)]
    pub secret: Option<SecretString>,
    /// The server secret before a rotation (as `serve`'s).
    #[arg(long, env = "ONCELY_SECRET_PREVIOUS", hide_env_values = true)]
    pub secret_previous: Option<SecretString>,
}

impl std::fmt::Debug for SecretArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretArgs")
            .field("environment", &self.environment)
            .field("secret", &self.secret)
            .field("secret_previous", &self.secret_previous)
            .finish()
    }
}

/// `oncely tenant webhook …`: where a tenant's events are delivered (Standard Webhooks).
#[derive(Debug, Subcommand)]
pub enum WebhookCommand {
    /// Add an endpoint and print its id and its signing secret (once: it is stored sealed).
    Add {
        /// The tenant whose events it receives (or `default`).
        name: String,
        /// Where to POST them: absolute http(s), no user info or fragment, at most 2,048 bytes;
        /// in production https and a public address (unless ONCELY_WEBHOOK_ALLOW_PRIVATE).
        url: String,
        /// Only these event types (comma-separated: `user.verified,email.failed`); default:
        /// every event.
        #[arg(long, value_delimiter = ',')]
        events: Vec<String>,
        #[command(flatten)]
        #[allow(missing_docs)]
        secrets: SecretArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        webhooks: WebhookArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
    /// List endpoints: id, tenant, URL, events, enabled or disabled (when, why), created, and
    /// until when a previous secret signs. Never a secret.
    List {
        /// Only this tenant's.
        name: Option<String>,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
    /// Stop delivering to an endpoint: it gets no new events, and its pending deliveries end
    /// dead (re-drive them with `oncely outbox retry` after `enable`).
    Disable {
        /// The endpoint's id.
        id: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
    /// Deliver to a disabled endpoint again (one that answered 410 Gone too).
    Enable {
        /// The endpoint's id.
        id: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
    /// Give an endpoint a new signing secret and print it (once). The previous one keeps
    /// signing beside it until the grace ends (one previous secret at a time).
    Rotate {
        /// The endpoint's id.
        id: String,
        /// How long the previous secret keeps signing (`1h`, `30m`, at most `30d`; default
        /// `24h`).
        #[arg(long, value_parser = parse_grace)]
        grace: Option<Duration>,
        #[command(flatten)]
        #[allow(missing_docs)]
        secrets: SecretArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
    /// Delete an endpoint (its pending deliveries end dead).
    Remove {
        /// The endpoint's id.
        id: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
}

/// The default `--grace` of `tenant webhook rotate`.
pub const WEBHOOK_GRACE: Duration = Duration::from_secs(24 * 3600);

impl WebhookCommand {
    /// Where the endpoints are.
    pub fn database(&self) -> &DatabaseArgs {
        match self {
            Self::Add { database, .. }
            | Self::List { database, .. }
            | Self::Disable { database, .. }
            | Self::Enable { database, .. }
            | Self::Rotate { database, .. }
            | Self::Remove { database, .. } => database,
        }
    }

    /// How it prints.
    pub fn output(&self) -> OutputArgs {
        match self {
            Self::Add { output, .. }
            | Self::List { output, .. }
            | Self::Disable { output, .. }
            | Self::Enable { output, .. }
            | Self::Rotate { output, .. }
            | Self::Remove { output, .. } => *output,
        }
    }
}

/// The longest `--grace` of a key rotation: a rotation is for a key that leaked or is lost.
pub const MAX_GRACE: Duration = Duration::from_secs(30 * 24 * 3600);

fn parse_grace(s: &str) -> Result<Duration, String> {
    let grace = parse_duration(s)?;
    if grace > MAX_GRACE {
        return Err("at most 30d: the old key must stop working soon".into());
    }
    Ok(grace)
}

/// Where the data lives. Prints its URL without the password.
#[derive(Clone, Args)]
pub struct DatabaseArgs {
    /// `postgres://…` or `sqlite://…`. PostgreSQL: several hosts (`user@h1:5432,h2:5432/db`)
    /// are tried in order, and `target_session_attrs=read-write` (or `primary`) takes the one
    /// that accepts writes, as libpq does, and follows it after a failover.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = defaults::DATABASE_URL,
        hide_env_values = true
    )]
    pub database_url: String,

    /// What stands between oncely and PostgreSQL: `none`, `session` (a pooler in session mode)
    /// or `transaction` (PgBouncer's `pool_mode = transaction` and the hosted poolers like it).
    #[arg(
        long,
        env = "ONCELY_DATABASE_POOLER",
        value_enum,
        default_value = "none"
    )]
    pub database_pooler: crate::backend::Pooler,

    /// A `postgres://` URL straight to the server (not through a transaction-mode pooler), for
    /// what needs one session: migrations, the workers' LISTEN, the dev inbox's lock. Behind a
    /// transaction-mode pooler without it, workers poll and migrations are refused.
    #[arg(long, env = "ONCELY_DATABASE_DIRECT_URL", hide_env_values = true)]
    pub database_direct_url: Option<String>,
}

impl DatabaseArgs {
    /// Where the database is.
    pub fn location(&self) -> crate::backend::Location {
        crate::backend::Location {
            url: self.database_url.clone(),
            direct_url: self.database_direct_url.clone(),
            pooler: self.database_pooler,
        }
    }
}

impl std::fmt::Debug for DatabaseArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseArgs")
            .field("location", &self.location())
            .finish()
    }
}

/// Settings shared by `serve` and `worker`. Its `Debug` shows no secret.
#[derive(Clone, Args)]
pub struct CommonArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseArgs,

    /// PostgreSQL connections of this process's one pool; a process whose workers LISTEN opens one
    /// more (the listener), and in development the `serve` that serves the dev inbox one more
    /// (its lock). Keep the sum over all `serve` and `worker` processes under the server's (or
    /// the pooler's) limit: see docs/deploying.md.
    #[arg(long, env = "ONCELY_DATABASE_POOL", default_value_t = defaults::DATABASE_POOL, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub database_pool: u32,

    /// `development` (generated secret, dev inbox) or `production` (everything explicit).
    #[arg(
        long = "env",
        env = "ONCELY_ENV",
        value_enum,
        default_value = "development"
    )]
    pub environment: Environment,

    /// Server secret (fingerprints, keyed hashes, tokens); at least 32 characters. In
    /// development, without it: generated once per database and kept in it, shared by every
    /// process of that database; required in production.
    #[arg(long, env = "ONCELY_SECRET", hide_env_values = true)]
    pub secret: Option<SecretString>,

    /// The server secret before a rotation, kept for a grace period (at least the key
    /// retention and the longest link lifetime, 7 days): retries of requests stored under it
    /// still replay, and links and emails it derived still work. New work uses ONCELY_SECRET.
    #[arg(long, env = "ONCELY_SECRET_PREVIOUS", hide_env_values = true)]
    pub secret_previous: Option<SecretString>,

    /// Base of links in emails: `http(s)://host[:port][/path]`, no query or fragment. Default
    /// `http://<bind>` in development; required in production.
    #[arg(long, env = "ONCELY_PUBLIC_URL", hide_env_values = true)]
    pub public_url: Option<String>,

    /// `dev` (the built-in inbox), `smtp://host:port` (`smtps://` for TLS), or
    /// `http(s)://host/emails` (Resend-compatible). Default `dev` in development; required in
    /// production. May hold SMTP credentials (`smtps://user:password@host`): never printed.
    #[arg(long, env = "ONCELY_MAILER", hide_env_values = true)]
    pub mailer: Option<String>,

    /// The SMTP password, kept out of `ONCELY_MAILER` (which then names the user:
    /// `smtps://user@host:465`).
    #[arg(long, env = "ONCELY_SMTP_PASSWORD", hide_env_values = true)]
    pub smtp_password: Option<SecretString>,

    /// Bearer token for an HTTP mailer.
    #[arg(long, env = "ONCELY_MAILER_API_KEY", hide_env_values = true)]
    pub mailer_api_key: Option<SecretString>,

    /// Sender of every email whose tenant names none (`tenant set --mail-from`): an address
    /// or "Name <address>".
    #[arg(long, env = "ONCELY_MAIL_FROM", default_value = defaults::MAIL_FROM)]
    pub mail_from: String,

    /// The header that carries each email's delivery key to the provider, which deduplicates
    /// retries by it. Default per transport: `Idempotency-Key` over HTTP (Resend's API, most
    /// APIs), `Resend-Idempotency-Key` over SMTP (Resend's SMTP). Plain SMTP relays read none:
    /// there a retry after a lost answer can be a second email.
    #[arg(long, env = "ONCELY_MAILER_IDEMPOTENCY_HEADER", value_parser = parse_idempotency_header)]
    pub mailer_idempotency_header: Option<IdempotencyHeader>,

    /// How long a claimed key or outbox job is held before another process may take it over.
    #[arg(long, env = "ONCELY_LEASE", default_value = defaults::LEASE, value_parser = parse_duration)]
    pub lease: Duration,

    /// First delay before an email is retried (doubling, with jitter, up to an hour; up to 60
    /// failed attempts within a 23 h horizon; throttled attempts spend none).
    #[arg(long, env = "ONCELY_RETRY_BASE", default_value = defaults::RETRY_BASE, value_parser = parse_duration)]
    pub retry_base: Duration,

    /// How often a worker sends one probe job of an email kind it paused because the provider
    /// refused our credentials or configuration (HTTP 401/403, SMTP 530/535, the HTTP mailer's URL
    /// answering 404/405 or a redirect); the kind resumes by itself once a probe is accepted.
    #[arg(long, env = "ONCELY_PAUSE_PROBE", default_value = defaults::PAUSE_PROBE, value_parser = parse_duration)]
    pub pause_probe: Duration,

    /// What an email whose outcome is unknown (the answer to a handed-over message was lost, a
    /// worker died mid-send) leads to: `resend` sends it again under the same delivery key —
    /// one email where the provider deduplicates by that key, maybe two over a plain SMTP relay
    /// — or `reconcile` parks it until it is settled, by the delivery lookup
    /// (ONCELY_MAILER_LOOKUP) or an operator (`oncely outbox unknown`, `oncely outbox settle`),
    /// so that nothing is sent twice. Default: `reconcile` over SMTP and the dev inbox,
    /// `resend` over an HTTP API (which deduplicates by the key). Webhook deliveries always
    /// resend: their receivers deduplicate by the event's id.
    #[arg(long, env = "ONCELY_ON_UNKNOWN", value_parser = on_unknown())]
    pub on_unknown: Option<OnUnknown>,

    /// Where to ask whether the mailer's provider accepted an email, by its delivery key: a URL
    /// with `{key}` where the key goes, answering JSON with `accepted` (true or false) — the
    /// test inbox's `http://host:port/deliveries/{key}`. A parked email (see --on-unknown) is
    /// then settled automatically: sent if accepted, else sent again. The dev inbox is asked
    /// without it. May carry a credential (never printed).
    #[arg(long, env = "ONCELY_MAILER_LOOKUP", hide_env_values = true)]
    pub mailer_lookup: Option<String>,

    /// How long a parked email waits before the lookup's "not accepted" is believed and it is
    /// sent again: a message still in the provider's hands when the answer was lost (slow, not
    /// lost) may be accepted after. An "accepted" settles it at once.
    #[arg(long, env = "ONCELY_LOOKUP_GRACE", default_value = defaults::LOOKUP_GRACE, value_parser = parse_duration)]
    pub lookup_grace: Duration,

    /// Workers only poll for jobs (for PostgreSQL behind a transaction-mode pooler, where
    /// LISTEN does not work).
    #[arg(long, env = "ONCELY_POLL_ONLY", value_parser = clap::builder::BoolishValueParser::new())]
    pub poll_only: bool,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub webhooks: WebhookArgs,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub emails: EmailArgs,

    /// Connect and total timeout of one webhook delivery attempt (a timeout after the request
    /// was sent is retried with the same `webhook-id`).
    #[arg(long, env = "ONCELY_WEBHOOK_TIMEOUT", default_value = defaults::WEBHOOK_TIMEOUT, value_parser = parse_duration)]
    pub webhook_timeout: Duration,
}

/// How emails look (shared by `serve`, `worker` and `templates`).
#[derive(Debug, Clone, Default, Args)]
pub struct EmailArgs {
    /// A directory of templates that override the embedded ones:
    /// `<dir>/<tenant or _default>/<locale>/<message>.{subject,txt,html}` (docs/emails.md).
    /// Read and checked at start: a broken template stops start-up.
    #[arg(long, env = "ONCELY_TEMPLATES", value_name = "DIR", value_parser = parse_templates_dir)]
    pub templates: Option<std::path::PathBuf>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub brand: BrandArgs,
}

/// The service's branding of emails (shared by `serve`, `worker` and `templates preview`).
#[derive(Debug, Clone, Default, Args)]
pub struct BrandArgs {
    /// The product name emails show for tenants without their own (`tenant set
    /// --product-name`). Default: the public URL's host.
    #[arg(long, env = "ONCELY_PRODUCT_NAME", value_name = "NAME")]
    pub product_name: Option<String>,

    /// Where users write with questions: shown in emails and used as their Reply-To, for
    /// tenants without their own (`tenant set --support-email`).
    #[arg(long, env = "ONCELY_SUPPORT_EMAIL", value_name = "ADDRESS")]
    pub support_email: Option<String>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub senders: SenderArgs,
}

/// A templates directory as given: not empty (`ONCELY_TEMPLATES=` set to nothing).
fn parse_templates_dir(value: &str) -> Result<std::path::PathBuf, String> {
    match value.trim().is_empty() {
        true => Err("empty: name the templates' directory, or leave ONCELY_TEMPLATES unset for the embedded templates".into()),
        false => Ok(value.into()),
    }
}

/// Which senders the mailer may send as (shared by `serve`, `worker` and `tenant set`).
#[derive(Debug, Clone, Default, Args)]
pub struct SenderArgs {
    /// Domains a tenant's sender (`tenant set --mail-from`) may have besides
    /// ONCELY_MAIL_FROM's: those the mail provider lets this service send as (comma-separated).
    #[arg(
        long,
        env = "ONCELY_MAIL_FROM_DOMAINS",
        value_name = "DOMAINS",
        value_delimiter = ','
    )]
    pub mail_from_domains: Vec<String>,
}

/// Which webhook URLs are allowed (shared by `serve`, `worker` and `tenant webhook add`).
#[derive(Debug, Clone, Copy, Args)]
pub struct WebhookArgs {
    /// Let webhooks reach private, link-local, CGNAT and (in production) loopback addresses:
    /// for receivers on a private network. Off by default: a tenant's URL must not reach the
    /// deployment's own network (SSRF).
    #[arg(long, env = "ONCELY_WEBHOOK_ALLOW_PRIVATE", value_parser = clap::builder::BoolishValueParser::new())]
    pub webhook_allow_private: bool,
}

impl std::fmt::Debug for CommonArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommonArgs")
            .field("database", &self.database)
            .field("database_pool", &self.database_pool)
            .field("environment", &self.environment)
            .field("secret", &self.secret)
            .field("secret_previous", &self.secret_previous)
            .field("public_url", &self.public_url)
            .field(
                "mailer",
                &self.mailer.as_deref().map(crate::backend::redact),
            )
            .field("mailer_api_key", &self.mailer_api_key)
            .field("smtp_password", &self.smtp_password)
            .field("mail_from", &self.mail_from)
            .field("mailer_idempotency_header", &self.mailer_idempotency_header)
            .field("lease", &self.lease)
            .field("retry_base", &self.retry_base)
            .field("pause_probe", &self.pause_probe)
            .field("on_unknown", &self.on_unknown)
            .field(
                "mailer_lookup",
                &self
                    .mailer_lookup
                    .as_deref()
                    .map(oncely_outbox::mail::LookedUp::shown),
            )
            .field("lookup_grace", &self.lookup_grace)
            .field("poll_only", &self.poll_only)
            .field("webhooks", &self.webhooks)
            .field("emails", &self.emails)
            .field("webhook_timeout", &self.webhook_timeout)
            .finish()
    }
}

/// Settings of `oncely gateway`. Its `Debug` shows no secret.
#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// The application behind the gateway: `http://host:port`, optionally with a base path
    /// (`http://127.0.0.1:3000/api`). Plain HTTP: run the gateway beside the application.
    #[arg(long, env = "ONCELY_GATEWAY_UPSTREAM")]
    pub upstream: String,

    /// A route to protect: `'METHOD /path'`, with `{name}` for a path segment
    /// (`--route 'POST /signup' --route 'POST /orders/{id}/pay'`). Repeat for more. Literal
    /// segments match without regard to case, and a trailing slash is ignored. Every other
    /// request passes through untouched.
    #[arg(long = "route", value_name = "'METHOD /path'")]
    pub routes: Vec<String>,

    /// A file of routes to protect, one `METHOD /path` per line (`#` starts a comment), in
    /// addition to any --route.
    #[arg(long, env = "ONCELY_GATEWAY_ROUTES", value_name = "FILE")]
    pub routes_file: Option<std::path::PathBuf>,

    /// A route (`'POST /path/{param}'`: a request's own method and path) whose requests may
    /// carry a method override (`X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`,
    /// a `_method` parameter) — for an application whose forms need one there. Elsewhere any
    /// override is 400 `request-ambiguous`; here only one that names a method protected at
    /// the path. Repeat for more.
    #[arg(long = "allow-method-override", value_name = "'METHOD /path'")]
    pub allow_method_override: Vec<String>,

    /// Listen address.
    #[arg(long, env = "ONCELY_GATEWAY_BIND", default_value = defaults::GATEWAY_BIND)]
    pub bind: SocketAddr,

    /// A header that names the tenant, set by a proxy you trust in front of the gateway (never
    /// by clients: whoever can set it chooses whose keys they use). Keys of one tenant never
    /// answer another's. Without it (or when a request lacks it) the tenant is the request's
    /// credential, hashed; without a credential, the shared anonymous tenant.
    #[arg(long, env = "ONCELY_GATEWAY_TENANT_HEADER", value_name = "NAME")]
    pub tenant_header: Option<http::HeaderName>,

    /// The header whose value (an API key, a bearer token) is the caller's credential: the
    /// tenant becomes a keyed hash of it, so two callers' keys never collide.
    #[arg(
        long,
        env = "ONCELY_GATEWAY_CREDENTIAL_HEADER",
        default_value = "authorization",
        value_name = "NAME"
    )]
    pub credential_header: http::HeaderName,

    /// A cookie that is the caller's credential (a session cookie), used when the credential
    /// header is absent.
    #[arg(long, env = "ONCELY_GATEWAY_CREDENTIAL_COOKIE", value_name = "NAME")]
    pub credential_cookie: Option<String>,

    /// The header that carries the stable derived key to the upstream, for its own downstream
    /// calls (the client's key is replaced by it: unique per tenant, route and key).
    #[arg(
        long,
        env = "ONCELY_GATEWAY_FORWARD_KEY_HEADER",
        default_value = "idempotency-key",
        value_name = "NAME"
    )]
    pub forward_key_header: http::HeaderName,

    /// How long to wait for the upstream's answer (a protected route's whole answer). A
    /// protected request's key is held, its lease renewed, for as long as it waits. Past it:
    /// 504, and the key is kept (the upstream may have acted): retries get 422.
    #[arg(long, env = "ONCELY_GATEWAY_UPSTREAM_TIMEOUT", default_value = defaults::GATEWAY_UPSTREAM_TIMEOUT, value_parser = parse_duration)]
    pub upstream_timeout: Duration,

    /// How long a claimed key is held before another process may take it over (renewed while
    /// the upstream works).
    #[arg(long, env = "ONCELY_LEASE", default_value = defaults::LEASE, value_parser = parse_duration)]
    pub lease: Duration,

    /// How long results are replayed (`24h`, `90m`, …).
    #[arg(long, env = "ONCELY_KEY_RETENTION", default_value = defaults::KEY_RETENTION, value_parser = parse_duration)]
    pub key_retention: Duration,

    /// Bytes of finished keys kept in memory, so that repeats are answered without the database
    /// (each entry until its key's retention ends; 0: none).
    #[arg(long, env = "ONCELY_REPLAY_CACHE_BYTES", default_value_t = defaults::REPLAY_CACHE_BYTES)]
    pub replay_cache_bytes: u64,

    /// The largest request body a protected route takes (413 beyond; nothing forwarded).
    #[arg(long, env = "ONCELY_GATEWAY_MAX_REQUEST_BODY", default_value_t = defaults::GATEWAY_MAX_REQUEST_BODY)]
    pub max_request_body: usize,

    /// The largest answer stored for replay; a larger one reaches the first caller (streamed)
    /// and its key is tombstoned: retries get 422, never a second run.
    #[arg(long, env = "ONCELY_GATEWAY_MAX_STORED_BODY", default_value_t = defaults::GATEWAY_MAX_STORED_BODY)]
    pub max_stored_body: usize,

    /// The most protected requests in flight at once (each holds its body, up to
    /// --max-request-body); more are answered 503 with Retry-After.
    #[arg(long, env = "ONCELY_GATEWAY_MAX_IN_FLIGHT", default_value_t = defaults::GATEWAY_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,

    /// How long a client may take to send a request's head (its line and headers) once it
    /// starts one; past it the connection is closed.
    #[arg(long, env = "ONCELY_GATEWAY_HEADER_TIMEOUT", default_value = defaults::GATEWAY_HEADER_TIMEOUT, value_parser = parse_duration)]
    pub header_timeout: Duration,

    /// How long a client may take to send a protected request's body (408 past it).
    #[arg(long, env = "ONCELY_GATEWAY_BODY_TIMEOUT", default_value = defaults::GATEWAY_BODY_TIMEOUT, value_parser = parse_duration)]
    pub body_timeout: Duration,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseArgs,

    /// Most PostgreSQL connections this process opens.
    #[arg(long, env = "ONCELY_DATABASE_POOL", default_value_t = defaults::DATABASE_POOL, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub database_pool: u32,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub secrets: SecretArgs,
}

/// Settings of `oncely serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,

    /// Listen address.
    #[arg(long, env = "ONCELY_BIND", default_value = defaults::BIND)]
    pub bind: SocketAddr,

    /// Bearer token that `GET /metrics` requires. Without one, `/metrics` is open in
    /// development and answers 404 in production: its counters (emails sent or skipped) must
    /// not tell an outsider which addresses have accounts.
    #[arg(long, env = "ONCELY_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<SecretString>,

    /// How long idempotent results are replayed (`24h`, `90m`, …).
    #[arg(long, env = "ONCELY_KEY_RETENTION", default_value = defaults::KEY_RETENTION, value_parser = parse_duration)]
    pub key_retention: Duration,

    /// Bytes of finished keys kept in memory, so that repeats of a finished request are
    /// answered without the database (each entry until its key's retention ends; 0: none).
    #[arg(long, env = "ONCELY_REPLAY_CACHE_BYTES", default_value_t = defaults::REPLAY_CACHE_BYTES)]
    pub replay_cache_bytes: u64,

    /// Outbox workers inside this process (0: API only).
    #[arg(long, env = "ONCELY_WORKERS", default_value_t = defaults::WORKERS)]
    pub workers: usize,

    /// Emails per window to one address requested by one client (counted whether or not the
    /// address has an account); more are not sent, and the answer does not change. Per client,
    /// so that one client cannot use up the owner's own emails. Default: 5 in production, 100
    /// in development.
    #[arg(long, env = "ONCELY_MAIL_CAP_PER_ADDRESS")]
    pub mail_cap_per_address: Option<u32>,

    /// Emails per window to one address from all clients together: the ceiling that protects a
    /// mailbox from many clients at once. Default: 4 × ONCELY_MAIL_CAP_PER_ADDRESS.
    #[arg(long, env = "ONCELY_MAIL_CAP_PER_ADDRESS_TOTAL")]
    pub mail_cap_per_address_total: Option<u32>,

    /// Emails per window requested by one client address. Default: 30 in production, 1000 in
    /// development.
    #[arg(long, env = "ONCELY_MAIL_CAP_PER_CLIENT")]
    pub mail_cap_per_client: Option<u32>,

    /// Failed logins per window for one address from one client (counted whether or not the
    /// address has an account); then that client's attempts at it are refused (429) until the
    /// window ends.
    #[arg(long, env = "ONCELY_LOGIN_CAP_PER_ADDRESS", default_value_t = defaults::LOGIN_CAP_PER_ADDRESS)]
    pub login_cap_per_address: u32,

    /// Failed logins per window for one address from all clients together; a client with no
    /// failure of its own for the address in the window still gets its attempt (strangers
    /// cannot lock the owner out).
    #[arg(long, env = "ONCELY_LOGIN_CAP_PER_ADDRESS_TOTAL", default_value_t = defaults::LOGIN_CAP_PER_ADDRESS_TOTAL)]
    pub login_cap_per_address_total: u32,

    /// Failed logins per window from one client address, whatever the addresses.
    #[arg(long, env = "ONCELY_LOGIN_CAP_PER_CLIENT", default_value_t = defaults::LOGIN_CAP_PER_CLIENT)]
    pub login_cap_per_client: u32,

    /// Proxies (comma-separated CIDRs or addresses) whose `X-Forwarded-For` / `Forwarded`
    /// name the client for the per-client cap. Default: none (the headers are ignored and the
    /// connection's peer is the client).
    #[arg(
        long,
        env = "ONCELY_TRUSTED_PROXIES",
        value_delimiter = ',',
        value_parser = crate::client_addr::parse_trusted_proxy
    )]
    pub trusted_proxies: Vec<ipnet::IpNet>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub retention: RetentionArgs,

    /// How often `serve` prunes expired rows (see `oncely prune`).
    #[arg(long, env = "ONCELY_PRUNE_INTERVAL", default_value = defaults::PRUNE_INTERVAL, value_parser = parse_duration)]
    pub prune_interval: Duration,

    /// Connections served at once; past it new ones wait in the kernel's backlog until one
    /// closes. The process raises its open-file limit for them where the hard limit allows.
    #[arg(long, env = "ONCELY_MAX_CONNECTIONS", default_value_t = defaults::MAX_CONNECTIONS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Time a client has to send a request's headers, from its connection or its previous
    /// response (a slowloris client, or an idle keep-alive connection, is closed then).
    #[arg(long, env = "ONCELY_HEADER_READ_TIMEOUT", default_value = defaults::HEADER_READ_TIMEOUT, value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// Time a client has to send a request's whole body (408 `request-body-timeout` after it).
    #[arg(long, env = "ONCELY_BODY_READ_TIMEOUT", default_value = defaults::BODY_READ_TIMEOUT, value_parser = parse_duration)]
    pub body_read_timeout: Duration,

    /// Time a response may wait for a client that reads none of it (the connection is closed
    /// after it).
    #[arg(long, env = "ONCELY_WRITE_TIMEOUT", default_value = defaults::WRITE_TIMEOUT, value_parser = parse_duration)]
    pub write_timeout: Duration,
}

/// How long rows are kept (used by `serve`'s pruner and by `oncely prune`).
#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    /// The window of both email caps (their counters are kept two windows).
    #[arg(long, env = "ONCELY_MAIL_CAP_WINDOW", default_value = defaults::MAIL_CAP_WINDOW, value_parser = parse_duration)]
    pub mail_cap_window: Duration,

    /// How long sent, dead and skipped outbox jobs (and their attempts) are kept after they
    /// finished.
    #[arg(long, env = "ONCELY_OUTBOX_RETENTION", default_value = defaults::OUTBOX_RETENTION, value_parser = parse_duration)]
    pub outbox_retention: Duration,

    /// The window of the login caps (their counters are kept two windows).
    #[arg(long, env = "ONCELY_LOGIN_CAP_WINDOW", default_value = defaults::LOGIN_CAP_WINDOW, value_parser = parse_duration)]
    pub login_cap_window: Duration,
}

impl RetentionArgs {
    /// The longest window of the email and login caps: counters are pruned after two of it.
    pub fn cap_window(&self) -> Duration {
        self.mail_cap_window.max(self.login_cap_window)
    }
}

/// Settings of `oncely prune`.
#[derive(Debug, Clone, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub output: OutputArgs,
}

/// Settings of `oncely worker`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,

    /// Concurrent workers in this process.
    #[arg(long, env = "ONCELY_WORKERS", default_value_t = defaults::WORKERS)]
    pub workers: usize,

    /// Run only these job kinds (comma-separated); default: all.
    #[arg(long, env = "ONCELY_WORKER_KINDS", value_delimiter = ',')]
    pub kinds: Vec<String>,
}

/// Settings of `oncely inbox`.
#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct InboxArgs {
    /// Ask a running inbox instead of running one.
    #[command(subcommand)]
    pub command: Option<InboxCommand>,
    /// SMTP listen address.
    #[arg(long, default_value = "127.0.0.1:2525")]
    pub smtp: SocketAddr,
    /// HTTP listen address (`POST /emails`, `GET /messages`, `DELETE /messages`, `GET /stats`,
    /// `PUT /faults`: changes the fields it names, `POST /reset` with `{}`; for CI: `POST /runs`,
    /// `GET /messages/wait`, `GET /messages/{id}/links`: docs/inbox.md).
    #[arg(long, default_value = "127.0.0.1:8025")]
    pub http: SocketAddr,
    /// Behave like a real provider (Resend): a repeat of an idempotency key within 24 h is
    /// acknowledged but not delivered again; the key with another message, or while a request
    /// with it is still being answered, is refused (409). Keys stay known when messages are
    /// deleted or other faults are set; `PUT /faults {"dedupe_window_ms": null}` turns it off.
    #[arg(long)]
    pub provider_mode: bool,
    /// The one header both intakes read the idempotency key from. Default per intake, as the
    /// mailers send: HTTP `Idempotency-Key`, SMTP `Resend-Idempotency-Key`.
    #[arg(long, value_parser = parse_idempotency_header)]
    pub idempotency_header: Option<IdempotencyHeader>,
    /// The most messages kept (the oldest go first).
    #[arg(long, default_value_t = oncely_inbox::Retention::default().max_messages, value_parser = parse_max_messages)]
    pub max_messages: usize,
    /// How long a message is kept (`24h`, `90m`, …).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub max_age: Duration,
    /// The most memory the kept messages and webhooks take, counted as the inbox holds them
    /// (a message's source, its decoded text and HTML parts, its headers and addresses): the
    /// oldest go first beyond it. `256MiB`, `64MB`, `1GiB` or bytes; at least 1MiB. One message
    /// is at most 10 MiB as sent and a quarter of this (larger: HTTP 413, SMTP 552).
    #[arg(long, default_value = "256MiB", value_parser = parse_max_bytes)]
    pub max_bytes: usize,
    /// An origin whose links the link scanner opens (`PUT /faults {"link_scanner": true}`):
    /// `http://` and a loopback host and port, e.g. `http://127.0.0.1:8080`, the service whose
    /// emails come here (repeat for more). It opens no other link; with none named it cannot
    /// be switched on.
    #[arg(long = "scan-origin", value_name = "URL", value_parser = parse_scan_origin)]
    pub scan_origins: Vec<oncely_inbox::Origin>,
}

/// `oncely inbox …`: what is asked of a running inbox.
#[derive(Debug, Clone, Subcommand)]
pub enum InboxCommand {
    /// Wait for mail in a running inbox, for shell scripts in CI: exits 0 and prints one line —
    /// the first link that matches --link-matches, or else the ids of the messages — once
    /// --count messages to --to (and/or of --run) are there; else one line on stderr saying
    /// why: exit 3 when fewer came within --within (or the run does not exist), 4 when none of
    /// their links matches, 1 when the inbox cannot be reached, 2 for a bad flag or regex
    /// (docs/inbox.md).
    Expect(ExpectArgs),
}

/// `oncely inbox expect`.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("what").required(true).multiple(true).args(["to", "run"])))]
pub struct ExpectArgs {
    /// The recipient to wait for (any case).
    #[arg(long, value_name = "ADDR", value_parser = non_blank)]
    pub to: Option<String>,
    /// The run (`POST /runs`) whose mail to wait for; with --to, the run's mail to that address.
    #[arg(long, value_name = "ID", value_parser = non_blank)]
    pub run: Option<String>,
    /// How many messages (those already there count).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub count: u64,
    /// How long to wait (`10s`, `500ms`, `2m`; at most 24h).
    #[arg(long, default_value = "10s", value_parser = parse_within)]
    pub within: Duration,
    /// Print the first link of the messages (oldest message first, in each in order) that this
    /// regular expression matches somewhere, e.g. `/v1/verify\?token=`; exit 4 if none does.
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    pub link_matches: Option<regex_automata::meta::Regex>,
    /// The inbox's HTTP address, as `oncely inbox --http` was given it (`host:port`, or a URL
    /// such as `http://127.0.0.1:8025` or the dev inbox's `http://localhost:8080/_dev/inbox`).
    #[arg(long, default_value = "127.0.0.1:8025", value_parser = InboxUrl)]
    pub http: url::Url,
    /// Print one JSON document on stdout: `complete`, the `messages` (`id`, `to`, `subject`,
    /// `links`, `codes`), and the `link` --link-matches chose (or null); a failure is one JSON
    /// line on stderr. The exit codes stay the same.
    #[arg(long)]
    pub json: bool,
}

fn parse_regex(s: &str) -> Result<regex_automata::meta::Regex, String> {
    regex_automata::meta::Regex::new(s).map_err(|e| {
        // The parser's message spans lines (the pattern, a caret, then `error: why`): its last.
        let why = e
            .syntax_error()
            .and_then(|syntax| {
                let text = syntax.to_string();
                let last = text.lines().last()?.trim();
                Some(last.strip_prefix("error: ").unwrap_or(last).to_owned())
            })
            .unwrap_or_else(|| e.to_string());
        format!("not a regular expression: {why}")
    })
}

/// `inbox expect --http`: `host:port` or an http(s) URL. Its errors never repeat the value (clap's
/// own would): it may carry a password.
#[derive(Clone)]
struct InboxUrl;

impl clap::builder::TypedValueParser for InboxUrl {
    type Value = url::Url;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<url::Url, clap::Error> {
        let refuse = |why: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for '--http <HTTP>': {why}\n"),
            )
            .with_cmd(cmd)
        };
        let s = value.to_str().ok_or_else(|| refuse("not UTF-8".into()))?;
        let with_scheme = if s.contains("://") {
            s.to_owned()
        } else {
            format!("http://{s}")
        };
        let url = url::Url::parse(&with_scheme).map_err(|e| refuse(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(refuse("expected host:port or an http(s) URL".into()));
        }
        Ok(url)
    }
}

/// A value that is not blank (`--to ""`: a shell variable that was not set).
fn non_blank(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.to_owned())
}

impl InboxArgs {
    /// The inbox these settings describe.
    pub fn config(&self) -> oncely_inbox::Config {
        let defaults = oncely_inbox::Config::default();
        let header = |default: String| {
            self.idempotency_header
                .as_ref()
                .map_or(default, ToString::to_string)
        };
        oncely_inbox::Config {
            retention: oncely_inbox::Retention {
                max_messages: self.max_messages,
                max_age: self.max_age,
                max_bytes: self.max_bytes,
            },
            http_idempotency_header: header(defaults.http_idempotency_header),
            smtp_idempotency_header: header(defaults.smtp_idempotency_header),
            scan_origins: self.scan_origins.clone(),
        }
    }
}

fn parse_idempotency_header(s: &str) -> Result<IdempotencyHeader, String> {
    IdempotencyHeader::new(s).map_err(|e| e.to_string())
}

fn parse_max_messages(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A size in bytes: a whole number, with or without a unit — `B`, `KB`, `MB`, `GB` (powers of
/// 1000), `KiB`, `MiB`, `GiB` (powers of 1024), in any case, a space allowed before it.
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let text = s.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let bad = || {
        format!(
            "{s:?} is not a size: expected bytes or a whole number with a unit, e.g. 256MiB, 64MB, 1GiB, 1048576"
        )
    };
    let number: u64 = number.parse().map_err(|_| bad())?;
    let factor: u64 = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return Err(bad()),
    };
    number
        .checked_mul(factor)
        .and_then(|bytes| usize::try_from(bytes).ok())
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn parse_scan_origin(s: &str) -> Result<oncely_inbox::Origin, String> {
    oncely_inbox::Origin::parse(s)
}

/// `inbox --max-bytes`: a size ([`parse_size`]) of at least 1 MiB.
fn parse_max_bytes(s: &str) -> Result<usize, String> {
    let bytes = parse_size(s)?;
    if bytes < 1 << 20 {
        return Err(format!(
            "{s:?}: at least 1MiB (1048576 bytes): the inbox needs room for a message (0 does not mean unbounded)"
        ));
    }
    Ok(bytes)
}

/// `inbox expect --within`: a duration up to a day (a CI step that waits longer is stuck).
fn parse_within(s: &str) -> Result<Duration, String> {
    let within = parse_duration(s)?;
    if within > Duration::from_secs(24 * 3600) {
        return Err("at most 24h".into());
    }
    Ok(within)
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 15m, 24h)"))?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

/// `--since`: an RFC 3339 time, or a duration before now (`2h`).
pub(crate) fn parse_since(s: &str) -> Result<OffsetDateTime, String> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(at) = OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(at);
    }
    let ago = humantime::parse_duration(s).map_err(|_| {
        format!("{s:?} is neither an RFC 3339 time (2025-01-31T08:00:00Z) nor a duration ago (2h, 30m, 1d)")
    })?;
    // To the whole second: a dry run prints it back, and a window a fraction of a second
    // wider changes nothing.
    time::Duration::try_from(ago)
        .ok()
        .and_then(|ago| OffsetDateTime::now_utc().checked_sub(ago))
        .and_then(|at| at.replace_nanosecond(0).ok())
        .ok_or_else(|| format!("{s:?} is too long ago"))
}
