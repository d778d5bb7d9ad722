//! The tower layer that gives axum routes the Idempotency-Key contract.
//!
//! Put it in front of mutating routes with `route_layer` (or `MethodRouter::layer`), so that
//! axum's matched route template is known and becomes part of the key's scope (without it, every
//! request shares the fixed route [`UNMATCHED_ROUTE`], as scope and as metric label; the
//! concrete path is always in the fingerprint):
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use oncely::{IdempotencyLayer, ServerSecret, store::sqlite::SqliteKeyStore};
//! # async fn demo(pool: sqlx::SqlitePool) {
//! let store = SqliteKeyStore::new(pool);
//! let secret = ServerSecret::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap();
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "paid" }))
//!     .route_layer(IdempotencyLayer::generic(store, secret));
//! # }
//! ```
//!
//! Two modes:
//! - [`IdempotencyLayer::transactional`]: the handler takes [`IdempotentTx`]; its first
//!   [`lock`](IdempotentTx::lock) opens a transaction and claims the key in it (work before it,
//!   such as password hashing, holds no transaction); the handler writes its rows in that
//!   transaction; the layer stores the response in it and commits once. Business rows and the
//!   stored result commit together or not at all. If `lock` fails ([`TxAborted`]) the layer
//!   answers what the claim found (replay, 422, 409, 503), whatever the handler returns. A
//!   repeat of a finished request is answered from one read, without a transaction.
//! - [`IdempotencyLayer::generic`]: claim (its own statement), run the handler while renewing its
//!   lease, store the result (retried within the lease if the write fails). Only a dead owner's
//!   key is taken over; an effect outside the database that ran before such a crash can run
//!   again, so the handler gets a [`DerivedKey`](crate::DerivedKey) (a request extension) to
//!   forward to downstream APIs that deduplicate by key.
//!
//! A response body is read up to the stored limit + 1 byte, never further: a longer one
//! tombstones the key and streams on to the client. In generic mode a handler that ran but
//! whose answer is lost — its body failed before the end, or it marked its answer
//! [`OutcomeUnknown`] — tombstones the key too: retries get 422, never a second run.
//!
//! Each request that reaches the layer with a key logs and counts one [`Outcome`]
//! (`oncely_idempotency_requests_total{outcome, route}`) and carries it as a response extension.
//!
//! The work after the key is claimed runs in its own task: a client that disconnects cannot
//! cancel a request half-way between its effect and the stored result.

mod contract;
mod handler;
mod outcome;
mod problems;
mod replay_cache;
mod service;
mod transaction;

use std::sync::Arc;
use std::time::Duration;

use tower::Layer;

pub use contract::{IDEMPOTENT_REPLAYED, RouteTemplate, UNMATCHED_ROUTE};
pub use outcome::{Outcome, OutcomeUnknown};
pub use replay_cache::ReplayCache;
pub use service::{IdempotencyService, ResponseFuture};
pub use transaction::{IdempotentTx, TxAborted, TxGuard};

/// Reads a request body as the layer does: at most `limit` bytes; beyond, the layer's 413
/// `request-too-large`; unreadable, its 400 `request-body-unreadable`. For code in front of
/// the layer that must read the body first (`oncely gateway` bounds the time it takes).
pub async fn read_body(
    body: axum::body::Body,
    limit: usize,
) -> Result<bytes::Bytes, axum::response::Response> {
    handler::read_request_body(body, limit)
        .await
        .map_err(|(_, response)| response)
}

use crate::ServerSecret;
use crate::fingerprint::JsonNormalizer;
use crate::store::KeyStore;

/// How the layer runs the handler; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Claim, run, store: for any handler.
    Generic,
    /// The handler writes in the claiming transaction; one commit.
    Transactional,
}

/// The layer's settings; see the builder methods of [`IdempotencyLayer`] for each default.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) secret: ServerSecret,
    pub(crate) mode: Mode,
    pub(crate) required: bool,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) wait: Duration,
    pub(crate) max_request_body: usize,
    pub(crate) max_stored_body: usize,
    pub(crate) normalizer: Option<JsonNormalizer>,
    pub(crate) replay_cache: Option<ReplayCache>,
}

/// The Idempotency-Key layer. Build it with [`generic`](Self::generic) or
/// [`transactional`](Self::transactional), then adjust.
#[derive(Clone)]
pub struct IdempotencyLayer<K> {
    store: K,
    config: Arc<Config>,
}

impl<K: KeyStore> IdempotencyLayer<K> {
    /// Claim, run, store (any handler).
    pub fn generic(store: K, secret: ServerSecret) -> Self {
        Self::new(store, secret, Mode::Generic)
    }

    /// The handler writes in the claiming transaction (take [`IdempotentTx`]); one commit.
    pub fn transactional(store: K, secret: ServerSecret) -> Self {
        Self::new(store, secret, Mode::Transactional)
    }

    fn new(store: K, secret: ServerSecret, mode: Mode) -> Self {
        Self {
            store,
            config: Arc::new(Config {
                secret,
                mode,
                required: true,
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(24 * 60 * 60),
                wait: Duration::from_millis(1500),
                max_request_body: 1024 * 1024,
                max_stored_body: 256 * 1024,
                normalizer: None,
                replay_cache: None,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Lets requests without a key through unprotected (default: a key is required, 400). Such a
    /// request carries no [`DerivedKey`](crate::DerivedKey): take it as `Option<Extension<_>>`.
    pub fn optional(self) -> Self {
        self.with(|c| c.required = false)
    }

    /// How long a claim holds its key before a retry may take it over (default 30 s); a live
    /// generic owner renews it every lease/3. In transactional mode it also bounds the handler
    /// and its transaction.
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|c| c.lease = lease)
    }

    /// How long results are replayed, counted from the first request (default 24 h).
    pub fn retention(self, retention: Duration) -> Self {
        self.with(|c| c.retention = retention)
    }

    /// How long a request waits for a concurrent one with the same key before answering 409
    /// (default 1.5 s). On SQLite's transactional claims the wait for the write lock is the
    /// pool's busy timeout.
    pub fn wait(self, wait: Duration) -> Self {
        self.with(|c| c.wait = wait)
    }

    /// The largest request body read (default 1 MiB; larger: 413, nothing stored).
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.with(|c| c.max_request_body = bytes)
    }

    /// The largest response body stored for replay (default 256 KiB). A larger one is returned
    /// to the first caller, and the key is tombstoned: retries get a 422, never a second run.
    pub fn max_stored_body(self, bytes: usize) -> Self {
        self.with(|c| c.max_stored_body = bytes)
    }

    /// Rewrites JSON bodies before fingerprinting, so that requests that mean the same match
    /// (for example, a normalized email address).
    pub fn normalize_json(self, normalizer: JsonNormalizer) -> Self {
        self.with(|c| c.normalizer = Some(normalizer))
    }

    /// Answers repeats of finished requests from `cache` when it holds their row, without the
    /// database (default: none, every repeat reads its row). A row enters the cache when a
    /// repeat reads it finished, and stays until its retention ends or the cache needs the room
    /// (see [`ReplayCache`]).
    pub fn replay_cache(self, cache: &ReplayCache) -> Self {
        let cache = cache.clone();
        self.with(|c| c.replay_cache = Some(cache))
    }
}

impl<S, K: Clone> Layer<S> for IdempotencyLayer<K> {
    type Service = IdempotencyService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.store.clone(), self.config.clone())
    }
}
