//! Integration tests of the outbox: one binary, every case against both stores.

#![allow(unreachable_pub)]

mod classification;
mod deadline;
mod delivery;
mod migrations;
mod recording;
mod store_conformance;
mod support;
mod wakeups;
