//! The `oncely` binary: parses the command line, resolves it once, and runs it on the
//! database `DATABASE_URL` names.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::bail;
use oncely_inbox::{Faults, Inbox};
use oncely_server::accounts::Accounts;
use oncely_server::app::{self, Application};
use oncely_server::backend::{self, Backend, COMMAND_POOL, Postgres, Sqlite};
use oncely_server::cli::{
    CheckArgs, Cli, Command, DatabaseArgs, GatewayArgs, InboxArgs, InboxCommand, KeyCommand,
    MigrateArgs, OutboxCommand, OutputArgs, PreviewArgs, PruneArgs, TemplatesCommand,
    TenantCommand,
};
use oncely_server::mail::MailContext;
use oncely_server::settings::{Environment, Settings, WorkerSettings};
use oncely_server::templates::{self, Templates};
use oncely_server::{demo, gateway, ops, startup, workers};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = startup::parse_command_line();
    let json = cli.command.json();
    let production = match &cli.command {
        Command::Serve(a) => a.common.environment == Environment::Production,
        Command::Worker(a) => a.common.environment == Environment::Production,
        _ => false,
    };
    // `oncely demo` tells its own story: the embedded service logs to a file unless `-v`.
    let demo_log =
        match matches!(cli.command, Command::Demo { verbose: false, .. }).then(demo::log_file) {
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
        Err(error) => ops::failed(&error, json),
    }
}

/// A command resolved (its settings checked), ready to run on a database.
enum Task {
    Serve(Settings),
    Worker(WorkerSettings),
    Migrate(MigrateArgs),
    Tenant(TenantCommand),
    Preview(Box<PreviewArgs>),
    Check(Option<PathBuf>, DatabaseArgs, OutputArgs),
    Prune(PruneArgs),
    Key(KeyCommand),
    Outbox(OutboxCommand),
    Gateway(Box<GatewayArgs>),
}

async fn run(cli: Cli, demo_log: Option<PathBuf>) -> anyhow::Result<()> {
    let task = match cli.command {
        Command::Inbox(InboxArgs {
            command: Some(InboxCommand::Expect(expect)),
            ..
        }) => {
            print!("{}", oncely_server::expect::run(&expect).await?);
            return Ok(());
        }
        Command::Inbox(args) => return run_inbox(args).await,
        Command::Demo { intents, .. } => return run_demo(intents, demo_log).await,
        Command::Check(args) => return run_check(args).await,
        Command::Gateway(args) => Task::Gateway(args),
        Command::Serve(args) => Task::Serve(Settings::from_args(*args)?),
        Command::Worker(args) => Task::Worker(WorkerSettings::from_args(args)?),
        Command::Migrate(args) => Task::Migrate(args),
        Command::Tenant(command) => Task::Tenant(command),
        Command::Templates(TemplatesCommand::Check {
            dir,
            database,
            output,
        }) => Task::Check(dir, database, output),
        Command::Templates(TemplatesCommand::Preview(args)) => Task::Preview(args),
        Command::Prune(args) => Task::Prune(args),
        Command::Key(command) => Task::Key(command),
        Command::Outbox(command) => Task::Outbox(command),
    };
    // The one place that asks which database: everything below is generic over it.
    let url = task.database_url();
    if Postgres::accepts(url) {
        task.run::<Postgres>().await
    } else if Sqlite::accepts(url) {
        task.run::<Sqlite>().await
    } else {
        Err(backend::unsupported(url))
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
            Self::Check(_, database, _) => &database.database_url,
            Self::Prune(args) => &args.database.database_url,
            Self::Key(KeyCommand::Show { database, .. }) => &database.database_url,
            Self::Outbox(command) => &command.database().database_url,
            Self::Gateway(args) => &args.database.database_url,
        }
    }

    async fn run<B: Accounts>(self) -> anyhow::Result<()> {
        match self {
            Self::Serve(settings) => serve::<B>(settings).await,
            Self::Worker(settings) => run_workers::<B>(settings).await,
            Self::Migrate(args) => {
                let backend = B::connect(&args.database.location(), COMMAND_POOL).await?;
                let migrated = startup::migrate(&backend).await?;
                print!("{}", ops::migrated::<B>(&migrated, args.output)?);
                Ok(())
            }
            Self::Tenant(command) => {
                print!("{}", ops::tenant::<B>(command).await?);
                Ok(())
            }
            Self::Preview(args) => templates::commands::preview::<B>(*args).await,
            Self::Check(dir, database, output) => {
                let report = templates::commands::check::<B>(dir.as_deref(), &database, output);
                print!("{}", report.await?);
                Ok(())
            }
            Self::Prune(args) => {
                print!("{}", ops::prune::<B>(args).await?);
                Ok(())
            }
            Self::Key(command) => {
                print!("{}", ops::key_show::<B>(command).await?);
                Ok(())
            }
            Self::Outbox(command) => {
                print!("{}", ops::outbox::<B>(command).await?);
                Ok(())
            }
            Self::Gateway(args) => gateway::run::<B>(*args, shutdown_signal()).await,
        }
    }
}

async fn serve<B: Accounts>(settings: Settings) -> anyhow::Result<()> {
    let workers = settings.workers;
    let app = Application::<B>::build(settings).await?;
    let addr = app.addr();
    tracing::info!(%addr, database = B::NAME, workers, "oncely is serving");
    println!("oncely API:   http://{addr}   (health: /healthz)");
    println!("dev inbox:    {}", app.dev_inbox_status());
    println!(
        "try:          curl -i http://{addr}/v1/signup -H 'Idempotency-Key: \"signup-1\"' \
         -H 'content-type: application/json' -d '{{\"email\":\"ada@example.com\"}}'"
    );
    app.run_until(shutdown_signal()).await
}

async fn run_demo(intents: usize, log: Option<PathBuf>) -> anyhow::Result<()> {
    println!(
        "oncely demo: {intents} signups, each retried 5 times, sent 5 times at once, and its key reused once with another body; the first 3 deliveries fail"
    );
    if let Some(log) = log {
        println!(
            "(the embedded service logs to {}; -v shows them here)",
            log.display()
        );
    }
    let report = demo::run(intents).await?;
    print!("{}", report.table());
    if !report.one_per_intent() {
        bail!("an intent did not produce exactly one account and one email");
    }
    Ok(())
}

/// `oncely check URL`: the table (or one JSON document) on stdout; exit 1 if a row failed.
async fn run_check(args: CheckArgs) -> anyhow::Result<()> {
    let json = args.json;
    let report = oncely_check::run(&args.into()).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    let failures = report.failures();
    if !failures.is_empty() {
        bail!(
            "{} of {} rows failed: {} (docs/check.md says what each checks)",
            failures.len(),
            report.rows.len(),
            failures.join(", ")
        );
    }
    Ok(())
}

async fn run_workers<B: Accounts>(settings: WorkerSettings) -> anyhow::Result<()> {
    let templates = Templates::for_start(settings.templates.as_deref())?;
    let backend: B = startup::open_to_serve(
        &settings.database.location(),
        settings.database.pool,
        settings.environment,
    )
    .await?;
    let secret = match &settings.generated_secret {
        Some(generated) => {
            startup::development_secret(&backend, generated, &settings.secret).await?
        }
        None => settings.secret,
    };
    startup::check_secret(&backend, &secret).await?;
    let (mailer, _) = app::mailer(&settings.mailer).await?;
    app::warn_unless_reconciled(settings.plan.options.on_unknown, &*mailer);
    let context = Arc::new(MailContext {
        secret,
        public_url: settings.public_url,
        brand: settings.brand,
        templates,
        mailer,
    });
    oncely_server::webhooks::delivery::reseal_at_start(&backend, &context.secret).await;
    let tenants: Vec<String> = backend.tenants().await?.into_iter().map(|t| t.id).collect();
    context
        .templates
        .check_tenants(&tenants)
        .map_err(anyhow::Error::msg)?;
    let shutdown = CancellationToken::new();
    let jobs = backend.jobs(settings.poll_only);
    let handles = workers::spawn(&backend, &jobs, &context, &settings.plan, &shutdown)?;
    println!(
        "oncely worker: {} worker(s) on {}",
        settings.plan.count,
        B::NAME
    );
    shutdown_signal().await;
    shutdown.cancel();
    for handle in handles {
        handle.await?;
    }
    Ok(())
}

/// glibc's malloc raises its mmap threshold (up to 32 MiB) each time a large block is freed;
/// from then on the inbox's large messages come from the heap, and a stream of them, evicted
/// oldest first, leaves it fragmented: under 300 messages of 1.9 MB over HTTP the process held
/// about 95 MiB beyond its byte budget (`--max-bytes`). A fixed threshold gives every large
/// block back when it is freed (the same load: within 40 MiB of the budget). glibc reads it from
/// the environment when a process starts, and there is no safe call to set it later: so
/// `oncely inbox` starts itself again once with `MALLOC_MMAP_THRESHOLD_=131072` (glibc's
/// default, made fixed) — the same process, by `exec` — unless the variable is set (the
/// operator's choice stands). Elsewhere than glibc this does nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn with_fixed_mmap_threshold() {
    use std::os::unix::process::CommandExt;
    const VARIABLE: &str = "MALLOC_MMAP_THRESHOLD_";
    if std::env::var_os(VARIABLE).is_some() {
        return;
    }
    // argv[0] resolved, when it names a path (not a name found on PATH).
    let argv0 = std::env::args_os()
        .next()
        .filter(|a| a.as_encoded_bytes().contains(&b'/'))
        .and_then(|a| std::fs::canonicalize(a).ok());
    let me = match restart_target(std::env::current_exe(), argv0) {
        Ok(me) => me,
        Err(reason) => {
            eprintln!(
                "warning: oncely inbox runs with glibc's moving malloc mmap threshold ({reason}; set {VARIABLE}=131072 to fix it): it may hold more memory than --max-bytes"
            );
            return;
        }
    };
    let error = std::process::Command::new(me)
        .args(std::env::args_os().skip(1))
        .env(VARIABLE, "131072")
        .exec();
    // Only on failure: the inbox runs on, with glibc's moving threshold.
    eprintln!(
        "warning: oncely inbox cannot restart with a fixed malloc mmap threshold ({error}; set {VARIABLE}=131072 to fix it): it may hold more memory than --max-bytes"
    );
}

/// The program `oncely inbox` restarts itself as ([`with_fixed_mmap_threshold`]): this
/// executable (`exe`, `/proc/self/exe`), unless it is not this program — started through the
/// dynamic loader (`ld-linux-x86-64.so.2 oncely inbox`), `exe` is the loader, which would run
/// `inbox` (exit 127) — or it cannot be found. `argv0`: argv[0] resolved, when it names a path.
/// Err: why not, for the warning.
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
fn restart_target(
    exe: std::io::Result<std::path::PathBuf>,
    argv0: Option<std::path::PathBuf>,
) -> Result<std::path::PathBuf, String> {
    let exe = exe.map_err(|error| format!("cannot find this program's path: {error}"))?;
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name.starts_with("ld-") || name.starts_with("ld.so") {
        return Err(format!(
            "started through the dynamic loader {}",
            exe.display()
        ));
    }
    if let Some(argv0) = argv0
        && argv0 != exe
    {
        return Err(format!(
            "this program's path {} is not {}, the one it was started as",
            exe.display(),
            argv0.display()
        ));
    }
    Ok(exe)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn with_fixed_mmap_threshold() {}

async fn run_inbox(args: InboxArgs) -> anyhow::Result<()> {
    with_fixed_mmap_threshold();
    let inbox = Inbox::with_config(args.config());
    if args.provider_mode {
        inbox.set_faults(Faults::provider());
    }
    let running = inbox.start(args.smtp, args.http).await?;
    println!(
        "oncely inbox: SMTP {}  HTTP http://{}  (GET /messages, DELETE /messages, GET /stats, \
         PUT /faults with the fields to change, POST /reset with {{}}; for CI: POST /runs, \
         GET /messages/wait, `oncely inbox expect`)",
        running.smtp_addr, running.http_addr
    );
    println!("the page: http://{}/", running.http_addr);
    if !running.http_addr.ip().is_loopback() {
        eprintln!(
            "warning: --http {} is not a loopback address and the inbox has no authentication: \
             anyone who reaches it reads every message (bind 127.0.0.1 unless that is what you want)",
            running.http_addr
        );
    }
    let config = inbox.config();
    println!(
        "idempotency keys read from {} (HTTP) and {} (SMTP){}; keeps the newest {} messages of the last {}, within {} (one message at most {} as sent)",
        config.http_idempotency_header,
        config.smtp_idempotency_header,
        if args.provider_mode {
            ", deduplicated within 24 h"
        } else {
            ", duplicates counted"
        },
        config.retention.max_messages,
        humantime::format_duration(config.retention.max_age),
        bytes(config.retention.max_bytes),
        bytes(config.retention.max_message_bytes()),
    );
    if config.scan_origins.is_empty() {
        println!(
            "the link scanner (PUT /faults {{\"link_scanner\": true}}) opens no link: name the origins it may open with --scan-origin"
        );
    } else {
        let origins: Vec<String> = config
            .scan_origins
            .iter()
            .map(ToString::to_string)
            .collect();
        println!(
            "the link scanner, when on, opens links to {} only",
            origins.join(", ")
        );
    }
    shutdown_signal().await;
    Ok(())
}

/// A size for people: whole MiB, KiB, or bytes.
fn bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
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

#[cfg(test)]
mod tests {
    use super::restart_target;

    /// Review 3, F8 and F9: `oncely inbox` restarts itself only as itself — started through the
    /// dynamic loader, `/proc/self/exe` is the loader, and restarting it ran `ld-linux inbox`
    /// (exit 127); it says why it does not, also when its path cannot be found (it said
    /// nothing).
    #[test]
    fn the_inbox_restarts_only_as_itself_and_says_why_not() {
        let dir = std::env::temp_dir().join(format!("oncely-restart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let program = dir.join("oncely");
        let other = dir.join("other");
        let loader = dir.join("ld-linux-x86-64.so.2");
        let link = dir.join("oncely-link");
        for file in [&program, &other, &loader] {
            std::fs::write(file, b"").unwrap();
        }
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&program, &link).unwrap();
        let real = std::fs::canonicalize(&program).unwrap();

        assert_eq!(restart_target(Ok(program.clone()), None), Ok(real.clone()));
        assert_eq!(
            restart_target(Ok(program.clone()), Some(real.clone())),
            Ok(real.clone())
        );
        assert_eq!(
            restart_target(Ok(link.clone()), Some(real.clone())),
            Ok(real.clone()),
            "the same file by another path"
        );
        // `/lib64/ld-linux-x86-64.so.2 target/release/oncely inbox`: argv[0] is the program.
        let through_loader = restart_target(Ok(loader.clone()), Some(real.clone()));
        assert!(
            through_loader
                .as_ref()
                .is_err_and(|why| why.contains("dynamic loader")),
            "{through_loader:?}"
        );
        let as_loader = restart_target(Ok(loader), None);
        assert!(as_loader.is_err(), "{as_loader:?}");
        let elsewhere = restart_target(
            Ok(other.clone()),
            Some(std::fs::canonicalize(&program).unwrap()),
        );
        assert!(elsewhere.is_err(), "{elsewhere:?}");
        let unknown = restart_target(Err(std::io::ErrorKind::NotFound.into()), None);
        assert!(
            unknown
                .as_ref()
                .is_err_and(|why| why.contains("cannot find this program's path")),
            "{unknown:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
