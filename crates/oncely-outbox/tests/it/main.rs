//! Integration tests of the outbox: one binary, every case against both stores.

#![allow(unreachable_pub)]

mod classification;
mod deadline;
mod delivery;
mod follow_ups;
mod frozen;
mod history;
mod html;
mod migrations;
mod partitions;
mod pausing;
mod point_of_no_return;
mod provider;
mod reconciling;
mod recording;
mod redrive;
mod skipped;
mod store_conformance;
mod support;
mod throttling;
mod unknown_outcomes;
mod wakeups;
