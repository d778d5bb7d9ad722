//! The `oncely` binary: [`oncely_cli::main`] (logging, then the command line read and run).
//!
//! Nothing else is here: the runtime and the future that runs a command are built in the
//! library, so their code is compiled once, there — a binary that awaited `oncely_cli::run`
//! itself compiled the whole service's async code a second time (release: half the time of a
//! first `cargo run --release`'s last step).

fn main() -> std::process::ExitCode {
    oncely_cli::main()
}
