//! The tower service the layer wraps around a route: readiness, safe methods passed through,
//! and each other request handed to the contract ([`super::contract`]) in a task of its own.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use http::{Method, Request};
use tower::{Service, ServiceExt};
use tracing::Instrument;

use super::{Config, contract, problems};
use crate::store::KeyStore;

/// The future of an [`IdempotencyService`] call.
pub type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// See [`IdempotencyLayer`](super::IdempotencyLayer).
#[derive(Clone)]
pub struct IdempotencyService<S, K> {
    inner: S,
    store: K,
    config: Arc<Config>,
}

impl<S, K> IdempotencyService<S, K> {
    pub(crate) fn new(inner: S, store: K, config: Arc<Config>) -> Self {
        Self {
            inner,
            store,
            config,
        }
    }
}

impl<S, K> Service<Request<Body>> for IdempotencyService<S, K>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    K: KeyStore,
{
    type Response = Response;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // The ready service is the one we were given; leave a fresh clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        if matches!(
            *req.method(),
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        ) {
            return Box::pin(inner.oneshot(req));
        }
        let store = self.store.clone();
        let config = self.config.clone();
        Box::pin(async move {
            // Its own task: a client that hangs up cannot stop us between effect and record.
            let work = tokio::spawn(contract::handle(inner, store, config, req).in_current_span());
            Ok(work
                .await
                .unwrap_or_else(|_| problems::internal_error("the request task failed")))
        })
    }
}
