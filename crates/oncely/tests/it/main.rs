//! Integration tests of the `oncely` library: one binary, every case against both stores.

#![allow(unreachable_pub)]

mod layer_contract;
mod migrations;
mod pool;
mod properties;
mod replay_cache;
mod shared_secret;
mod store_conformance;
mod support;
