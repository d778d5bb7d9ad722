//! The `oncely` command: the command line (clap) and what each command does with the service
//! library ([`oncely_server`]), the checker ([`oncely_check`]) and the test inbox
//! ([`oncely_inbox`]). `main.rs` only calls [`main`]: logging, the runtime, then [`run`].
//!
//! - [`cli`]: the commands and reading the command line; [`args`]: flags several commands share.
//! - [`commands`]: one file per command, its `Args` beside its `run`.
//! - [`resolve`]: the arguments resolved into the service's settings, checked once.
//! - [`output`]: tables, `--json` documents, one-line failures and exit codes.

pub mod args;
pub mod cli;
pub mod commands;
pub mod output;
pub mod resolve;

use std::path::PathBuf;

use oncely_server::accounts::Accounts;
use oncely_server::backend::{self, Backend, Postgres, Sqlite};
use oncely_server::demo;
use oncely_server::environment::Environment;

use crate::args::DatabaseArgs;
use crate::cli::{Cli, Command};
use crate::commands::inbox::{InboxArgs, InboxCommand};
use crate::commands::key::KeyCommand;
use crate::commands::migrate::MigrateArgs;
use crate::commands::outbox::OutboxCommand;
use crate::commands::prune::PruneArgs;
use crate::commands::templates::{PreviewArgs, TemplatesCommand};
use crate::commands::tenant::TenantCommand;
use crate::commands::{self as run_};
use crate::output::OutputArgs;
use oncely_server::settings::{Settings, WorkerSettings};

/// A command resolved (its settings checked), ready to run on a database.
enum Task {
    Serve(Settings),
    Worker(WorkerSettings),
    Migrate(MigrateArgs),
    Tenant(TenantCommand),
    Preview(Box<PreviewArgs>),
    ValidateTemplates(Option<PathBuf>, DatabaseArgs, OutputArgs),
    Prune(PruneArgs),
    Key(KeyCommand),
    Outbox(OutboxCommand),
}

/// The `oncely` binary: logging set up, then the command line read and run on a multi-threaded
/// runtime; the exit code.
pub fn main() -> std::process::ExitCode {
    let cli = cli::parse_command_line();
    let json = cli.command.json();
    let production = match &cli.command {
        Command::Serve(a) => a.common.environment == Environment::Production,
        Command::Worker(a) => a.common.environment == Environment::Production,
        _ => false,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return output::failed(&anyhow::Error::new(error), json),
    };
    runtime.block_on(async move {
        // `oncely demo` tells its own story: the embedded service logs to a file unless `-v`.
        let demo_log = match matches!(cli.command, Command::Demo { verbose: false, .. })
            .then(demo::log_file)
        {
            Some(Ok((file, path))) => {
                oncely_server::telemetry::init_tracing_to_file(file);
                Some(path)
            }
            Some(Err(error)) => {
                eprintln!("oncely demo: cannot create a log file ({error}); the service logs here");
                None
            }
            None => None,
        };
        if demo_log.is_none() {
            oncely_server::telemetry::init_tracing(production);
        }
        match run(cli, demo_log).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            // One clear line (with --json, one JSON object), never a backtrace.
            Err(error) => output::failed(&error, json),
        }
    })
}

/// Runs a command read from the command line; `demo_log`: where `oncely demo`'s embedded
/// service logs (`None`: here).
pub async fn run(cli: Cli, demo_log: Option<PathBuf>) -> anyhow::Result<()> {
    let task = match cli.command {
        Command::Inbox(InboxArgs {
            command: Some(InboxCommand::Expect(expect)),
            ..
        }) => {
            print!("{}", run_::inbox_expect::run(&expect).await?);
            return Ok(());
        }
        Command::Inbox(args) => return run_::inbox::run(args).await,
        Command::Demo { intents, .. } => return run_::demo::run(intents, demo_log).await,
        Command::Check(args) => return run_::check::run(args).await,
        Command::Gateway(args) => return run_::gateway::run(*args).await,
        Command::Serve(args) => Task::Serve(args.settings()?),
        Command::Worker(args) => Task::Worker(args.settings()?),
        Command::Migrate(args) => Task::Migrate(args),
        Command::Tenant(command) => Task::Tenant(command),
        Command::Templates(TemplatesCommand::Check {
            dir,
            database,
            output,
        }) => Task::ValidateTemplates(dir, database, output),
        Command::Templates(TemplatesCommand::Preview(args)) => Task::Preview(args),
        Command::Prune(args) => Task::Prune(args),
        Command::Key(command) => Task::Key(command),
        Command::Outbox(command) => Task::Outbox(command),
    };
    // The one place that asks which database (the gateway, on the key store alone, asks in its
    // own start-up): everything below is generic over it.
    let url = task.database_url();
    if Postgres::accepts(url) {
        task.run::<Postgres>().await
    } else if Sqlite::accepts(url) {
        task.run::<Sqlite>().await
    } else {
        Err(backend::unsupported(url).into())
    }
}

impl Task {
    fn database_url(&self) -> &str {
        match self {
            Self::Serve(settings) => &settings.database.url,
            Self::Worker(settings) => &settings.database.url,
            Self::Migrate(args) => &args.database.database_url,
            Self::Tenant(command) => &command.database().database_url,
            Self::Preview(args) => &args.database.database_url,
            Self::ValidateTemplates(_, database, _) => &database.database_url,
            Self::Prune(args) => &args.database.database_url,
            Self::Key(KeyCommand::Show { operator, .. }) => &operator.database.database_url,
            Self::Outbox(command) => &command.database().database_url,
        }
    }

    async fn run<B: Accounts>(self) -> anyhow::Result<()> {
        match self {
            Self::Serve(settings) => run_::serve::run::<B>(settings).await,
            Self::Worker(settings) => run_::worker::run::<B>(settings).await,
            Self::Migrate(args) => run_::migrate::run::<B>(args).await,
            Self::Tenant(command) => {
                print!("{}", run_::tenant::tenant::<B>(command).await?);
                Ok(())
            }
            Self::Preview(args) => run_::templates::preview::<B>(*args).await,
            Self::ValidateTemplates(dir, database, output) => {
                let report = run_::templates::validate::<B>(dir.as_deref(), &database, output);
                print!("{}", report.await?);
                Ok(())
            }
            Self::Prune(args) => {
                print!("{}", run_::prune::prune::<B>(args).await?);
                Ok(())
            }
            Self::Key(command) => {
                print!("{}", run_::key::key_show::<B>(command).await?);
                Ok(())
            }
            Self::Outbox(command) => {
                print!("{}", run_::outbox::outbox::<B>(command).await?);
                Ok(())
            }
        }
    }
}

/// Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        if let Ok(mut signal) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            signal.recv().await;
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! { () = ctrl_c => {}, () = terminate => {} }
}
