//! The `oncely` service: account flows built on idempotency keys and a transactional outbox.
//!
//! Map:
//! - [`cli`]: the command line (clap); [`settings`]: what it resolves to, checked once (the
//!   server secret, mailer, public URL, limits), handed to [`app::Application::build`].
//! - [`startup`]: reading the command line, opening the database as a command needs it
//!   (migrating on purpose, or checking the schema), one-line errors.
//! - [`secret`]: the server secret (given, or the shared development secret; checked against
//!   the other processes of the database) and the webhook signing secrets sealed under it;
//!   [`environment`]: development or production.
//! - [`backend`]: the seam — PostgreSQL or SQLite, chosen once by URL; connection, the key and
//!   job stores, migrations; everything else is generic over a [`backend::Backend`].
//! - [`app`]: assembly: database, mailer, routes, workers; binding (port 0 in tests); shutdown.
//! - [`routes`]: the HTTP API (`/v1/signup`, `/v1/verify`) behind the idempotency layer.
//! - [`accounts`]: the account flows' storage: statements per dialect, Rust once; [`limits`]:
//!   the email and login caps.
//! - [`email`], [`token`], [`password`]: addresses, one-time tokens, Argon2id; [`identity`]:
//!   what the application learns (exchange, login); [`code`]: one-time codes and return URLs.
//! - [`mail`]: the emails and the outbox handlers that send them; [`workers`]: starting them.
//! - [`openapi`]: the OpenAPI description (`/openapi.json`).
//! - [`ops`]: operator commands (`oncely outbox list|show|retry`, `key show`, `tenant create`).
//! - [`telemetry`]: logs, request ids, metrics; [`prune`]: retention; [`demo`]: `oncely demo`.
//! - [`expect`]: `oncely inbox expect`, waiting for mail in a running test inbox (CI scripts).
//!
//! Imports go one way: helpers that import nothing of the crate ([`environment`], [`email`],
//! [`token`], [`display`], …) → the domain ([`backend`], [`limits`], [`accounts`], [`secret`],
//! [`webhooks`]' events, [`branding`], [`templates`]) → the service ([`routes`], [`mail`],
//! [`workers`], [`app`]) → the `oncely` binary (oncely-cli).
//!
//! `main.rs` parses and resolves the command line, picks the backend once, and calls into these.

#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod accounts;
pub mod app;
pub mod backend;
pub mod branding;
pub mod client_addr;
pub mod code;
pub mod connections;
pub mod demo;
pub mod display;
pub mod email;
pub mod environment;
pub mod identity;
pub mod limits;
pub mod mail;
pub mod openapi;
pub mod password;
pub mod prune;
pub mod routes;
pub mod secret;
pub mod settings;
pub mod startup;
pub mod telemetry;
pub mod templates;
pub mod token;
pub mod webhooks;
pub mod workers;
