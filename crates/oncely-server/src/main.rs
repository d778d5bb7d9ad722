//! The `oncely` binary: parses the command line and calls into the library.

use std::sync::Arc;

use anyhow::bail;
use clap::Parser;
use oncely_inbox::{Faults, Inbox};
use oncely_server::accounts::Accounts;
use oncely_server::app::{self, Application};
use oncely_server::backend::{self, Backend, COMMAND_POOL, Postgres, Sqlite};
use oncely_server::config::{
    Cli, Command, Environment, InboxArgs, MailerChoice, PruneArgs, TenantCommand, WorkerArgs,
};
use oncely_server::mail::MailContext;
use oncely_server::workers;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let production = match &cli.command {
        Command::Serve(a) => a.common.environment == Environment::Production,
        Command::Worker(a) => a.common.environment == Environment::Production,
        _ => false,
    };
    oncely_server::telemetry::init_tracing(production);
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // One clear line, never a backtrace.
            eprintln!("oncely: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let Some(url) = cli.command.database_url() else {
        return run_without_database(cli.command).await;
    };
    // The one place that asks which database: everything below is generic over it.
    if Postgres::accepts(url) {
        run_on::<Postgres>(cli.command).await
    } else if Sqlite::accepts(url) {
        run_on::<Sqlite>(cli.command).await
    } else {
        Err(backend::unsupported(url))
    }
}

/// The commands that need no database.
async fn run_without_database(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Inbox(args) => run_inbox(args).await,
        Command::Demo { intents } => {
            println!(
                "oncely demo: {intents} signups, each retried 5 times, sent 5 times at once, and its key reused once with another body; the first 3 deliveries fail"
            );
            let report = oncely_server::demo::run(intents).await?;
            print!("{}", report.table());
            if !report.one_per_intent() {
                bail!("an intent did not produce exactly one account and one email");
            }
            Ok(())
        }
        _ => unreachable!("every other command names its database"),
    }
}

async fn run_on<B: Accounts>(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => {
            let app = Application::<B>::build(&args).await?;
            let addr = app.addr();
            tracing::info!(%addr, database = B::NAME, workers = args.workers, "oncely is serving");
            println!("oncely API:   http://{addr}   (health: /healthz)");
            if let Some((_, running)) = app.dev_inbox() {
                println!(
                    "dev inbox:    http://{addr}/_dev/inbox   (JSON: /_dev/inbox/messages; SMTP {})",
                    running.smtp_addr
                );
            }
            println!(
                "try:          curl -i http://{addr}/v1/signup -H 'Idempotency-Key: \"signup-1\"' \
                 -H 'content-type: application/json' -d '{{\"email\":\"ada@example.com\"}}'"
            );
            app.run_until(shutdown_signal()).await
        }
        Command::Worker(args) => run_workers::<B>(args).await,
        Command::Migrate(args) => {
            let backend = B::connect(&args.database_url, COMMAND_POOL).await?;
            backend.migrate().await?;
            println!("migrations applied ({})", B::NAME);
            Ok(())
        }
        Command::Tenant(TenantCommand::Create { name, database }) => {
            create_tenant::<B>(&name, &database.database_url).await
        }
        Command::Prune(args) => prune::<B>(args).await,
        Command::Key(command) => {
            print!("{}", oncely_server::ops::key_show::<B>(command).await?);
            Ok(())
        }
        Command::Outbox(command) => {
            print!("{}", oncely_server::ops::outbox::<B>(command).await?);
            Ok(())
        }
        Command::Inbox(_) | Command::Demo { .. } => {
            unreachable!("`run` runs these without a database")
        }
    }
}

async fn create_tenant<B: Accounts>(name: &str, database_url: &str) -> anyhow::Result<()> {
    let tenant = oncely_server::ops::tenant_name(name)?;
    let backend = B::connect(database_url, COMMAND_POOL).await?;
    backend.migrate().await?;
    let key = oncely_server::ops::create_tenant(&backend, &tenant).await?;
    println!("tenant {tenant} created. Its API key (shown once; only a hash is stored):\n{key}");
    Ok(())
}

async fn run_workers<B: Accounts>(args: WorkerArgs) -> anyhow::Result<()> {
    let common = &args.common;
    if common.mailer_choice()? == MailerChoice::Dev {
        bail!(
            "the dev inbox lives inside `oncely serve`; give `oncely worker` an ONCELY_MAILER URL"
        );
    }
    let secret = common.server_secret()?;
    let public_url = common.public_url(None)?;
    let backend = B::connect(&common.database.database_url, common.database_pool).await?;
    backend.migrate().await?;
    let (mailer, _) = app::mailer(common).await?;
    let context = Arc::new(MailContext {
        secret,
        public_url,
        from: common.mail_from.clone(),
        mailer,
    });
    let plan = app::worker_plan(common, args.workers, args.kinds.clone());
    let shutdown = CancellationToken::new();
    let jobs = backend.jobs(common.poll_only);
    let handles = workers::spawn(&backend, &jobs, &context, &plan, &shutdown)?;
    println!("oncely worker: {} worker(s) on {}", args.workers, B::NAME);
    shutdown_signal().await;
    shutdown.cancel();
    for handle in handles {
        handle.await??;
    }
    Ok(())
}

async fn prune<B: Accounts>(args: PruneArgs) -> anyhow::Result<()> {
    use indicatif::{ProgressBar, ProgressStyle};
    let backend = B::connect(&args.database.database_url, COMMAND_POOL).await?;
    backend.migrate().await?;
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} pruning {msg}").expect("a valid template"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let progress = |table: &str, n: u64| bar.set_message(format!("{table}: {n} rows deleted"));
    let retention = args.retention.retention();
    let pruned =
        oncely_server::prune::prune_all(&backend, &backend.jobs(true), retention, progress).await?;
    bar.finish_and_clear();
    println!(
        "pruned {} rows: {} idempotency keys, {} outbox jobs, {} tokens, {} email-cap counters",
        pruned.total(),
        pruned.keys,
        pruned.jobs,
        pruned.tokens,
        pruned.rate_limits
    );
    Ok(())
}

async fn run_inbox(args: InboxArgs) -> anyhow::Result<()> {
    let inbox = Inbox::new();
    if args.provider_mode {
        inbox.set_faults(Faults::provider());
    }
    let running = inbox.start(args.smtp, args.http).await?;
    println!(
        "oncely inbox: SMTP {}  HTTP http://{}  (GET /messages, GET /stats, PUT /faults)",
        running.smtp_addr, running.http_addr
    );
    shutdown_signal().await;
    Ok(())
}

async fn shutdown_signal() {
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
