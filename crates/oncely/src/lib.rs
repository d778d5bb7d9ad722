//! Idempotency keys for axum routes: retried requests become harmless.
//!
//! A client sends `Idempotency-Key: "<unique per operation>"` and reuses it on every retry.
//! The first request runs; its response is stored with the key; every retry gets that response
//! back (`Idempotent-Replayed: true`) without running the handler again.
//!
//! # Quick Start
//!
//! ```no_run
//! use axum::{Json, Router, routing::post};
//! use oncely::store::{KeyStore, sqlite::{SqliteKeyStore, connect_options}};
//! use oncely::{IdempotencyLayer, ServerSecret};
//!
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     let pool = sqlx::SqlitePool::connect_with(connect_options("sqlite://keys.db")?).await?;
//!     let store = SqliteKeyStore::new(pool);
//!     store.migrate().await?;
//!     let secret = ServerSecret::new(std::env::var("ONCELY_SECRET")?.into_bytes())?;
//!
//!     let app = Router::new()
//!         .route("/payments", post(|| async { Json(serde_json::json!({"id": "pay_1"})) }))
//!         .route_layer(IdempotencyLayer::generic(store, secret));
//!
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     axum::serve(listener, app).await?;
//!     Ok(())
//! }
//! ```
//!
//! # The contract
//!
//! | case | answer |
//! |---|---|
//! | key missing (route requires one) | 400 `…/problems/idempotency-key-missing` |
//! | key malformed (empty, > 255 chars, not visible ASCII, two headers) | 400 `…/idempotency-key-invalid` |
//! | first request | the handler runs; its response is stored |
//! | same key and request, completed | stored status, body and `Content-Type`, `Location`, `ETag`, `Link`, plus `Idempotent-Replayed: true` |
//! | same key, different request (method, path, query or body) | 422 `…/idempotency-key-reused` |
//! | same key, still running | wait up to 1.5 s and replay; else 409 `…/idempotency-key-in-use` with `Retry-After` |
//! | running, owner alive | its lease is renewed while it runs: never taken over |
//! | running, owner dead (lease expired) | taken over with a new fencing token; the old owner can no longer complete |
//! | database busy (SQLite write lock held by another writer) | 503 `…/storage-busy` with `Retry-After` |
//! | handler answers 5xx or rejects before any effect (400, 401, 403, 408, 409, 413, 415, 429) | nothing stored; the key is free |
//! | response body over the stored limit | first caller gets it, streamed (never buffered whole); retries get 422 `…/idempotency-key-unreplayable` |
//! | generic mode: the handler ran but its answer is lost (its body failed, or it marked it [`OutcomeUnknown`]) | the key is kept: retries get 422 `…/idempotency-key-unreplayable`, never a second run |
//!
//! "Same request" is decided by a keyed fingerprint of the method, the route, the concrete
//! path, the canonical query and the canonical body (JSON: key order and whitespace ignored,
//! numbers compared exactly). During a secret rotation
//! ([`ServerSecret::with_previous`]) a fingerprint made with a previous secret still matches.
//!
//! # Map of the crate
//!
//! - [`key`]: the `Idempotency-Key` header ([`IdempotencyKey`]).
//! - [`scope`]: who a key belongs to ([`TenantId`], [`Scope`]).
//! - [`fingerprint`]: request fingerprints, exact canonical JSON ([`CanonicalJson`]), the server
//!   secret and its rotation, keys derived for downstream calls.
//! - [`store`]: the [`KeyStore`](store::KeyStore) trait, and its implementation on PostgreSQL
//!   and SQLite (features `postgres` and `sqlite`, both default), each dialect with its own
//!   statements and migrations; the store's clock.
//! - [`layer`]: the tower layer, in *generic* and *transactional* mode, and the outcomes it logs.
//! - [`problem`]: RFC 9457 problem responses, and every problem type the layer answers with
//!   ([`ProblemType`](problem::ProblemType)).

#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod body;
pub mod fingerprint;
pub mod key;
pub mod layer;
pub mod problem;
pub mod scope;
pub mod store;

pub use fingerprint::{CanonicalJson, DerivedKey, Fingerprint, JsonNormalizer, ServerSecret};
pub use key::{IdempotencyKey, KeyError};
pub use layer::{
    IdempotencyLayer, IdempotentTx, Mode, Outcome, OutcomeUnknown, ReplayCache, TxAborted,
};
pub use problem::Problem;
pub use scope::{Scope, TenantId};

/// The header that marks a replayed response (`Idempotent-Replayed: true`).
pub use layer::IDEMPOTENT_REPLAYED;
