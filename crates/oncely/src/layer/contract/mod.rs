//! The contract's state machine: one request, from the key header to the response.
//!
//! Here: the key, the scope, the fingerprints, and what an existing key row answers (replay,
//! 422). The two ways to claim, run, store and release are in [`generic`] and
//! [`in_transaction`].

mod generic;
mod in_transaction;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::MatchedPath;
use axum::response::{IntoResponse, Response};
use http::{HeaderName, HeaderValue, Request, StatusCode, header};
use tokio::time::Instant;
use tower::ServiceExt;

use super::handler::{self, Handler};
use super::outcome::{Answer, finish};
use super::problems;
use super::{Config, Mode};
use crate::fingerprint::{CanonicalRequest, Fingerprints, RequestTarget};
use crate::store::{ClaimRequest, KeyStore, Record, RecordState, StoredResponse};
use crate::{IdempotencyKey, KeyError, Scope, TenantId};

/// The route (scope and metric label) of a request that reached the layer without axum's
/// `MatchedPath`.
pub const UNMATCHED_ROUTE: &str = "<unmatched>";

/// The route template of a request that reaches the layer outside axum's router — a request
/// extension set by whatever matched the route (`oncely gateway` does). It becomes the scope's
/// route and the metric label, as axum's `MatchedPath` would (which wins when both are set).
/// Keep templates few and fixed: never a raw path (unbounded labels, one scope per path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTemplate(String);

impl RouteTemplate {
    /// A route template, such as `/orders/{id}/pay`.
    pub fn new(template: impl Into<String>) -> Self {
        Self(template.into())
    }

    /// The template.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The header that marks a replayed response.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// One request, from the key header to the response.
pub(crate) async fn handle<S: Handler, K: KeyStore>(
    inner: S,
    store: K,
    config: Arc<Config>,
    req: Request<Body>,
) -> Response {
    let (parts, body) = req.into_parts();
    // Without axum's matched route (the layer used outside a router, or with `Router::layer`)
    // neither the metric label nor the scope may be the raw path: unbounded label cardinality,
    // and one scope per path. All such requests share one fixed route; the concrete path is in
    // the fingerprint, so a key reused on another path is a 422, never another path's answer.
    // A gateway that matches routes itself names the template in a `RouteTemplate`.
    let route = match (
        parts.extensions.get::<MatchedPath>(),
        parts.extensions.get::<RouteTemplate>(),
    ) {
        (Some(matched), _) => matched.as_str().to_owned(),
        (None, Some(template)) => template.as_str().to_owned(),
        (None, None) => UNMATCHED_ROUTE.to_owned(),
    };
    let key = match IdempotencyKey::from_headers(&parts.headers) {
        Ok(key) => key,
        Err(KeyError::Missing) if !config.required => {
            return inner
                .oneshot(Request::from_parts(parts, body))
                .await
                .into_response();
        }
        Err(error) => return finish(&route, None, problems::key_problem(&error)),
    };
    let tenant = parts
        .extensions
        .get::<TenantId>()
        .cloned()
        .unwrap_or_default();
    let scope = Scope::new(tenant, parts.method.as_str(), route, key);
    let bytes = match handler::read_request_body(body, config.max_request_body).await {
        Ok(bytes) => bytes,
        Err(answer) => return finish(&scope.route, Some(&scope), answer),
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let target = RequestTarget {
        method: parts.method.as_str(),
        route: &scope.route,
        path: parts.uri.path(),
        query: parts.uri.query(),
    };
    // One fingerprint per secret (current first): a row a previous secret fingerprinted is
    // still the same request during a rotation's grace period.
    let fingerprints = Arc::new(Fingerprints::new(
        CanonicalRequest::new(&target, content_type, &bytes, config.normalizer.as_ref()),
        &config.secret,
    ));
    let req = Request::from_parts(parts, Body::from(bytes));
    let claim = ClaimRequest {
        scope: &scope,
        fingerprint: fingerprints.current(),
        lease: config.lease,
        retention: config.retention,
    };
    let answer = match config.mode {
        Mode::Generic => generic::run(inner, &store, &config, &claim, &fingerprints, req).await,
        Mode::Transactional => {
            in_transaction::run(inner, &store, &config, &claim, &fingerprints, req).await
        }
    };
    finish(&scope.route, Some(&scope), answer)
}

/// The answer an existing row gives, or `None` while it is in progress.
/// `fingerprints`: this request's, under the current and any previous secret.
fn answer_from_record(record: &Record, fingerprints: &Fingerprints) -> Option<Answer> {
    if fingerprints.position(&record.fingerprint).is_none() {
        return Some(problems::reused());
    }
    match &record.state {
        RecordState::InProgress { .. } => None,
        RecordState::Completed(stored) => Some((super::Outcome::Replayed, replay(stored))),
        RecordState::Tombstoned { reason } => Some(problems::unreplayable(reason)),
    }
}

/// The answer the replay cache holds for this request: a finished row of its scope (its
/// replay, or 422 for another request's key).
fn cached_answer<K: KeyStore>(
    config: &Config,
    store: &K,
    scope: &Scope,
    fingerprints: &Fingerprints,
) -> Option<Answer> {
    let record = config.replay_cache.as_ref()?.get(scope, store.now())?;
    answer_from_record(&record, fingerprints)
}

/// Offers a row just read to the replay cache (which keeps finished rows only).
fn remember<K: KeyStore>(config: &Config, store: &K, scope: &Scope, record: &Record) {
    if let Some(cache) = &config.replay_cache {
        cache.remember(scope, record, store.now());
    }
}

/// The stored response, marked `Idempotent-Replayed: true`.
fn replay(stored: &StoredResponse) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, stored.body.clone()).into_response();
    let headers = response.headers_mut();
    headers.remove(header::CONTENT_TYPE);
    for (name, value) in &stored.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            headers.append(name, value);
        }
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// Bounded waiting for a concurrent request with the same key: 10 ms, doubling to 100 ms.
struct BoundedWait {
    deadline: Instant,
    pause: Duration,
}

impl BoundedWait {
    fn new(wait: Duration) -> Self {
        Self {
            deadline: Instant::now() + wait,
            pause: Duration::from_millis(10),
        }
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Sleeps before the next try; `false` once the wait is over.
    async fn pause(&mut self) -> bool {
        let remaining = self.remaining();
        if remaining.is_zero() {
            return false;
        }
        tokio::time::sleep(self.pause.min(remaining)).await;
        self.pause = (self.pause * 2).min(Duration::from_millis(100));
        true
    }
}
