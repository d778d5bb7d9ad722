//! The `oncely` binary: logging, then the command line read and run ([`oncely_cli::run`]).

use oncely_cli::cli::Command;
use oncely_server::demo;
use oncely_server::environment::Environment;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = oncely_cli::cli::parse_command_line();
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
    match oncely_cli::run(cli, demo_log).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // One clear line (with --json, one JSON object), never a backtrace.
        Err(error) => oncely_cli::output::failed(&error, json),
    }
}
