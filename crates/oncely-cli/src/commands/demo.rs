//! `oncely demo`: a storm of retried, concurrent and conflicting signups against an embedded
//! instance, and the proof that every intent made one account and one email.

use std::path::PathBuf;

use anyhow::bail;
use oncely_server::demo;

/// Runs `oncely demo` with `intents` signups; `log`: the file the embedded service logs to.
pub async fn run(intents: usize, log: Option<PathBuf>) -> anyhow::Result<()> {
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
