//! The `oncely` binary: parses the command line and calls into the library.

use std::sync::Arc;

use anyhow::bail;
use clap::Parser;
use oncely_inbox::{Faults, Inbox};
use oncely_server::app::{self, Application};
use oncely_server::config::{
    Cli, Command, Environment, InboxArgs, MailerChoice, PruneArgs, TenantCommand, WorkerArgs,
};
use oncely_server::database::Database;
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
    match cli.command {
        Command::Serve(args) => {
            let app = Application::build(&args).await?;
            let addr = app.addr();
            tracing::info!(%addr, database = app.database().kind(), workers = args.workers, "oncely is serving");
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
        Command::Worker(args) => run_workers(args).await,
        Command::Migrate(args) => {
            let database = Database::connect(&args.database_url).await?;
            database.migrate().await?;
            println!("migrations applied ({})", database.kind());
            Ok(())
        }
        Command::Inbox(args) => run_inbox(args).await,
        Command::Tenant(TenantCommand::Create { name, database }) => {
            create_tenant(&name, &database.database_url).await
        }
        Command::Prune(args) => prune(args).await,
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
        Command::Key(command) => {
            print!("{}", oncely_server::ops::key_show(command).await?);
            Ok(())
        }
        Command::Outbox(command) => {
            print!("{}", oncely_server::ops::outbox(command).await?);
            Ok(())
        }
    }
}

async fn create_tenant(name: &str, database_url: &str) -> anyhow::Result<()> {
    use oncely_server::accounts::Accounts;
    use oncely_server::routes::tenants::{hash_api_key, new_api_key};
    let tenant = oncely::TenantId::parse(name).map_err(|e| anyhow::anyhow!("{e}"))?;
    if tenant == oncely::TenantId::default() {
        bail!("`default` is the tenant of requests without an API key; choose another name");
    }
    let database = Database::connect(database_url).await?;
    database.migrate().await?;
    let key = new_api_key();
    let created = match &database {
        Database::Postgres(s) => s.create_tenant(tenant.as_str(), &hash_api_key(&key)).await,
        Database::Sqlite(s) => s.create_tenant(tenant.as_str(), &hash_api_key(&key)).await,
    };
    created.map_err(|_| anyhow::anyhow!("tenant {tenant} already exists"))?;
    println!("tenant {tenant} created. Its API key (shown once; only a hash is stored):\n{key}");
    Ok(())
}

async fn run_workers(args: WorkerArgs) -> anyhow::Result<()> {
    use oncely_server::accounts::Accounts;
    let common = &args.common;
    if common.mailer_choice()? == MailerChoice::Dev {
        bail!(
            "the dev inbox lives inside `oncely serve`; give `oncely worker` an ONCELY_MAILER URL"
        );
    }
    let secret = common.server_secret()?;
    let public_url = common.public_url(None)?;
    let database =
        Database::connect_pool(&common.database.database_url, common.database_pool).await?;
    database.migrate().await?;
    let (mailer, _) = app::mailer(common).await?;
    let context = Arc::new(MailContext {
        secret,
        public_url,
        from: common.mail_from.clone(),
        mailer,
    });
    let plan = app::worker_plan(common, args.workers, args.kinds.clone());
    let shutdown = CancellationToken::new();
    let handles = match &database {
        Database::Postgres(s) => {
            workers::spawn(s, &s.jobs(common.poll_only), &context, &plan, &shutdown)?
        }
        Database::Sqlite(s) => {
            workers::spawn(s, &s.jobs(common.poll_only), &context, &plan, &shutdown)?
        }
    };
    println!(
        "oncely worker: {} worker(s) on {}",
        args.workers,
        database.kind()
    );
    shutdown_signal().await;
    shutdown.cancel();
    for handle in handles {
        handle.await??;
    }
    Ok(())
}

async fn prune(args: PruneArgs) -> anyhow::Result<()> {
    use indicatif::{ProgressBar, ProgressStyle};
    use oncely_server::accounts::Accounts;
    let database = Database::connect(&args.database.database_url).await?;
    database.migrate().await?;
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} pruning {msg}").expect("a valid template"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let progress = |table: &str, n: u64| bar.set_message(format!("{table}: {n} rows deleted"));
    let retention = args.retention.retention();
    let pruned = match &database {
        Database::Postgres(s) => {
            oncely_server::prune::prune_all(s, &s.jobs(true), retention, progress).await?
        }
        Database::Sqlite(s) => {
            oncely_server::prune::prune_all(s, &s.jobs(true), retention, progress).await?
        }
    };
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
