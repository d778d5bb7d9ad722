//! One file per command: its arguments (clap) beside what it runs.

pub mod check;
pub mod demo;
pub mod gateway;
pub mod inbox;
pub mod inbox_expect;
pub mod key;
pub mod migrate;
pub mod outbox;
pub mod prune;
pub mod serve;
pub mod templates;
pub mod tenant;
pub mod webhook;
pub mod worker;

use clap::Args;

use crate::args::DatabaseArgs;
use crate::output::OutputArgs;

/// What every operator command (`outbox`, `tenant`, `tenant webhook`, `key`) takes: the
/// database it works on and how it prints.
#[derive(Debug, Clone, Args)]
pub struct OperatorArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub output: OutputArgs,
}
