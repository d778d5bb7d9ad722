//! The `oncely` binary: parses the command line and calls into the library.

use clap::Parser;
use oncely_server::app::Application;
use oncely_server::config::{Cli, Command, Environment};
use oncely_server::database::Database;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let production =
        matches!(&cli.command, Command::Serve(a) if a.environment == Environment::Production);
    init_tracing(production);
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
            tracing::info!(%addr, database = app.database().kind(), "oncely is serving");
            println!("oncely API:  http://{addr}  (health: http://{addr}/healthz)");
            app.run_until(shutdown_signal()).await
        }
        Command::Migrate(args) => {
            let database = Database::connect(&args.database_url).await?;
            database.migrate().await?;
            println!("migrations applied ({})", database.kind());
            Ok(())
        }
    }
}

fn init_tracing(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
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
