//! The `oncely` service: account flows built on idempotency keys (and, next, a transactional
//! outbox).
//!
//! Map:
//! - [`config`]: command line and environment (`DATABASE_URL`, `ONCELY_*`), the server secret.
//! - [`database`]: PostgreSQL or SQLite, chosen by URL; migrations; readiness.
//! - [`app`]: the HTTP application: routes, binding (port 0 in tests), graceful shutdown.
//!
//! `main.rs` only parses the command line and calls into these.

#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod app;
pub mod config;
pub mod database;
