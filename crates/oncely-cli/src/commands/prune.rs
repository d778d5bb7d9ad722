//! `oncely prune`: deletes expired keys, old outbox history, expired tokens and old email-cap
//! counters, in small batches.

use std::fmt::Write;

use clap::Args;
use oncely_server::accounts::Accounts;
use oncely_server::backend::COMMAND_POOL;
use serde_json::json;

use crate::args::DatabaseArgs;
use crate::args::RetentionArgs;
use crate::output::OutputArgs;
use crate::output::render;

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

/// `oncely prune`: a full pass (with a progress spinner on a terminal's stderr, none with
/// `--json`), and what it deleted.
pub async fn prune<B: Accounts>(args: PruneArgs) -> anyhow::Result<String> {
    use indicatif::{ProgressBar, ProgressStyle};
    let (backend, holds): (B, _) =
        oncely_server::startup::open_for_keys(&args.database.location(), COMMAND_POOL).await?;
    let bar = if args.output.json {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} pruning {msg}").expect("a valid template"),
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    };
    let progress = |table: &str, n: u64| bar.set_message(format!("{table}: {n} rows deleted"));
    let retention = oncely_server::prune::Retention::new(
        args.retention.outbox_retention,
        args.retention.cap_window(),
    );
    let pruned = oncely_server::prune::prune_all(
        &backend,
        &backend.jobs(true),
        (retention, holds),
        progress,
    )
    .await?;
    bar.finish_and_clear();
    let value = json!({
        "keys": pruned.keys,
        "jobs": pruned.jobs,
        "tokens": pruned.tokens,
        "rate_limits": pruned.rate_limits,
        "total": pruned.total(),
    });
    render(args.output, &value, |out| {
        writeln!(
            out,
            "pruned {} rows: {} idempotency keys, {} outbox jobs, {} tokens, {} email-cap counters",
            pruned.total(),
            pruned.keys,
            pruned.jobs,
            pruned.tokens,
            pruned.rate_limits
        )?;
        Ok(())
    })
}
