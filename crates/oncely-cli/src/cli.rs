//! The command line: the commands and their flags (each command's `Args` live beside it in
//! [`crate::commands`]), read once — an invalid value from an environment variable names the
//! variable. Secrets never print.

use clap::Parser;
use clap::Subcommand;
use clap::error::ContextKind;
use clap::error::ContextValue;
use clap::error::ErrorKind;

use crate::commands::check::CheckArgs;
use crate::commands::gateway::GatewayArgs;
use crate::commands::inbox::InboxArgs;
use crate::commands::inbox::InboxCommand;
use crate::commands::key::KeyCommand;
use crate::commands::migrate::MigrateArgs;
use crate::commands::outbox::OutboxCommand;
use crate::commands::prune::PruneArgs;
use crate::commands::serve::ServeArgs;
use crate::commands::templates::TemplatesCommand;
use crate::commands::tenant::TenantCommand;
use crate::commands::worker::WorkerArgs;

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
            Self::Key(KeyCommand::Show { operator, .. }) => operator.output.json,
            Self::Check(args) => args.json,
            Self::Inbox(args) => {
                matches!(&args.command, Some(InboxCommand::Expect(expect)) if expect.json)
            }
            Self::Serve(_) | Self::Worker(_) | Self::Demo { .. } | Self::Gateway(_) => false,
        }
    }
}

/// The command line, or the process exits with clap's status: help and version print as
/// usual; an invalid value that came from an environment variable is one line naming that
/// variable (`oncely: ONCELY_POLL_ONLY=maybe: …`), not only the flag nobody typed.
pub fn parse_command_line() -> Cli {
    match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => match from_environment(&error, std::env::args_os().skip(1)) {
            Some(line) => {
                eprintln!("oncely: {line}");
                std::process::exit(error.exit_code());
            }
            None => error.exit(),
        },
    }
}

/// The line for a clap `error` about an argument whose value came from its environment
/// variable (set, and the flag not in `args`); `None` for any other error.
pub fn from_environment(
    error: &clap::Error,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Option<String> {
    if !matches!(
        error.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    // "--poll-only <POLL_ONLY>"
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let command = <Cli as clap::CommandFactory>::command();
    let arg = find_arg(&command, long)?;
    let variable = arg.get_env()?.to_str()?.to_owned();
    let value = std::env::var_os(&variable)?;
    let flag = format!("--{long}");
    let given_as_flag = args.into_iter().any(|a| {
        let a = a.to_string_lossy();
        a == flag || a.starts_with(&format!("{flag}="))
    });
    if given_as_flag {
        return None;
    }
    let problem = match error.get(ContextKind::ValidValue) {
        Some(ContextValue::Strings(valid)) => {
            format!("invalid value (possible values: {})", valid.join(", "))
        }
        _ => {
            let problem = std::error::Error::source(error)
                .map_or_else(|| "invalid value".to_owned(), |e| e.to_string());
            // A boolean's accepted spellings are hidden from --help; say them here.
            let accepted: Vec<String> = arg
                .get_possible_values()
                .iter()
                .map(|v| v.get_name().to_owned())
                .collect();
            if accepted.is_empty() {
                problem
            } else {
                format!("{problem} (accepted: {})", accepted.join(", "))
            }
        }
    };
    Some(if arg.is_hide_env_values_set() {
        format!("{variable}: {problem}")
    } else {
        format!("{variable}={}: {problem}", value.to_string_lossy())
    })
}

pub(crate) fn find_arg<'c>(command: &'c clap::Command, long: &str) -> Option<&'c clap::Arg> {
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(long) && a.get_env().is_some())
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| find_arg(sub, long))
        })
}
