//! The service end to end: real HTTP, real SMTP into the test inbox, PostgreSQL and SQLite.

#![allow(unreachable_pub)]

// Test support (the app, requests, a browser) lives in ../support, shared with hash_pool.rs.
#[path = "../support/mod.rs"]
mod support;
pub use support::{browser, requests};

mod accounts;
mod api_description;
mod attacks;
mod busy_database;
mod chaos;
mod check;
mod client_caps;
mod dev_inbox;
mod dev_inbox_html;
mod docs_cli;
mod email_change;
mod email_events;
mod emails;
mod events;
mod exchange;
mod flows;
mod gateway;
mod gateway_express;
mod health;
mod hostile;
mod inbox_ci;
mod link_in_a_browser;
mod login;
mod one_payload;
mod ops;
mod pooler;
mod properties;
mod schema;
mod security;
mod signup;
mod slow_clients;
mod startup;
mod webhooks_crash;
mod webhooks_docs;
mod webhooks_endpoints;
mod workers;
