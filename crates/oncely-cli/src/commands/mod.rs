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
