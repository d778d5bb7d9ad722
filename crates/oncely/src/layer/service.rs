//! The service the layer wraps around a route: the contract's state machine.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::MatchedPath;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, header};
use tokio::time::Instant;
use tower::{Service, ServiceExt};
use tracing::Instrument;

use super::transaction::{ClaimFn, Claimed, Refusal, TxState};
use super::{Config, IdempotentTx, Mode, Outcome};
use crate::fingerprint::{CanonicalRequest, Fingerprints, RequestTarget};
use crate::problem::ProblemType;
use crate::store::{
    Claim, ClaimRequest, Completion, KeyStore, Record, RecordState, StoreError, StoredResponse,
};
use crate::{DerivedKey, IdempotencyKey, KeyError, Scope, TenantId};

/// The route (scope and metric label) of a request that reached the layer without axum's
/// `MatchedPath`.
pub const UNMATCHED_ROUTE: &str = "<unmatched>";

/// The header that marks a replayed response.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

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
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

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
            let work = tokio::spawn(handle(inner, store, config, req).in_current_span());
            Ok(work
                .await
                .unwrap_or_else(|_| internal_error("the request task failed")))
        })
    }
}

/// One request, from the key header to the response.
async fn handle<S, K>(inner: S, store: K, config: Arc<Config>, req: Request<Body>) -> Response
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    K: KeyStore,
{
    let (parts, body) = req.into_parts();
    // Without axum's matched route (the layer used outside a router, or with `Router::layer`)
    // neither the metric label nor the scope may be the raw path: unbounded label cardinality,
    // and one scope per path. All such requests share one fixed route; the concrete path is in
    // the fingerprint, so a key reused on another path is a 422, never another path's answer.
    let route = match parts.extensions.get::<MatchedPath>() {
        Some(matched) => matched.as_str().to_owned(),
        None => UNMATCHED_ROUTE.to_owned(),
    };
    let key = match IdempotencyKey::from_headers(&parts.headers) {
        Ok(key) => key,
        Err(KeyError::Missing) if !config.required => {
            return inner
                .oneshot(Request::from_parts(parts, body))
                .await
                .into_response();
        }
        Err(error) => return finish(&route, None, Outcome::Invalid, key_problem(&error)),
    };
    let tenant = parts
        .extensions
        .get::<TenantId>()
        .cloned()
        .unwrap_or_default();
    let scope = Scope::new(tenant, parts.method.as_str(), route, key);
    let bytes = match read_body(body, config.max_request_body).await {
        Ok(bytes) => bytes,
        Err(problem) => return finish(&scope.route, Some(&scope), Outcome::Invalid, problem),
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
    let (outcome, response) = match config.mode {
        Mode::Generic => generic(inner, &store, &config, &claim, &fingerprints, req).await,
        Mode::Transactional => {
            transactional(inner, &store, &config, &claim, &fingerprints, req).await
        }
    };
    finish(&scope.route, Some(&scope), outcome, response)
}

/// Claim, run, store.
async fn generic<S, K>(
    inner: S,
    store: &K,
    config: &Config,
    claim: &ClaimRequest<'_>,
    fingerprints: &Fingerprints,
    mut req: Request<Body>,
) -> (Outcome, Response)
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    K: KeyStore,
{
    let mut waiter = Waiter::new(config.wait);
    // Which secret's fingerprint the claim uses: the current one, or the previous one that
    // fingerprinted an in-progress row (so its expired lease can be taken over).
    let mut secret_index = 0;
    let token = loop {
        let attempt = ClaimRequest {
            fingerprint: fingerprints.get(secret_index),
            ..claim.clone()
        };
        match store.claim(&attempt).await {
            Ok(Claim::Acquired { token, .. }) => break token,
            Ok(Claim::Existing(record)) => {
                if let Some(answer) = answer_from_record(&record, fingerprints) {
                    return answer;
                }
                let matched = fingerprints.position(&record.fingerprint);
                if let Some(index) = matched.filter(|i| *i != secret_index) {
                    secret_index = index;
                    continue;
                }
            }
            Ok(Claim::Busy) => {}
            Err(error) => return store_failed(&error),
        }
        if !waiter.pause().await {
            return in_use();
        }
    };
    // Downstream calls get the key of the secret that fingerprinted the row: stable for every
    // retry of the scope, across a rotation too.
    req.extensions_mut().insert(DerivedKey::for_scope(
        fingerprints.secret(secret_index),
        claim.scope,
    ));
    // While the handler runs, renew the lease (every lease/3): only a dead owner is taken over.
    let renewing = keep_renewed(store, claim.scope, token, config.lease);
    tokio::pin!(renewing);
    let collected = tokio::select! {
        collected = run(inner, req, None, config.max_stored_body) => collected,
        never = &mut renewing => match never {},
    };
    let (parts, body) = match collected {
        Ok(collected) => collected,
        Err(response) => {
            release_logged(store, claim.scope, token).await;
            return (Outcome::Released, response);
        }
    };
    if releases_key(parts.status) {
        release_logged(store, claim.scope, token).await;
        return (
            Outcome::Released,
            Response::from_parts(parts, body.into_body()),
        );
    }
    let completion = completion_for(config, &parts, &body);
    // A failed write is retried with backoff, the lease still renewed, for at most one lease.
    let stored = tokio::select! {
        stored = complete_with_retry(store, claim.scope, token, &completion, config.lease) => stored,
        never = &mut renewing => match never {},
    };
    match stored {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            route = %claim.scope.route,
            "idempotency lease lost: another request took the key over; this result is not stored"
        ),
        Err(error) => tracing::error!(
            route = %claim.scope.route, %error,
            "could not store an idempotent result after retrying; the key frees when its lease expires"
        ),
    }
    (
        Outcome::Created,
        Response::from_parts(parts, body.into_body()),
    )
}

/// Renews the lease of `token` every `lease / 3`, for as long as it is polled. Stops renewing
/// (and waits forever) once the claim is lost; a failed renewal is logged and tried again.
async fn keep_renewed<K: KeyStore>(
    store: &K,
    scope: &Scope,
    token: crate::store::FencingToken,
    lease: Duration,
) -> Infallible {
    let period = (lease / 3).max(Duration::from_millis(1));
    loop {
        tokio::time::sleep(period).await;
        match store.renew(scope, token, lease).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(route = %scope.route, "idempotency lease lost while the handler ran");
                return std::future::pending().await;
            }
            Err(error) => {
                tracing::warn!(route = %scope.route, %error, "could not renew an idempotency lease");
            }
        }
    }
}

/// Stores a completion, retrying failed writes with backoff (10 ms doubling to 1 s) for at most
/// `within`; the last error if every try failed.
async fn complete_with_retry<K: KeyStore>(
    store: &K,
    scope: &Scope,
    token: crate::store::FencingToken,
    completion: &Completion,
    within: Duration,
) -> Result<bool, StoreError> {
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(10);
    loop {
        match store.complete(scope, token, completion).await {
            Err(error) if Instant::now() + pause < deadline => {
                tracing::warn!(route = %scope.route, %error, "storing an idempotent result failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            done => return done,
        }
    }
}

/// Run the handler; its first `IdempotentTx::lock` claims the key in a transaction; store the
/// result in it, commit once. A handler that never locked is claimed for after it returns.
async fn transactional<S, K>(
    inner: S,
    store: &K,
    config: &Config,
    claim: &ClaimRequest<'_>,
    fingerprints: &Arc<Fingerprints>,
    mut req: Request<Body>,
) -> (Outcome, Response)
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    K: KeyStore,
{
    // Most repeats of a key are retries of a finished request: answer those from one read,
    // without opening a transaction. Anything else (no row, in progress, expired) takes the
    // claim, which decides under the database's locks.
    match store.get(claim.scope).await {
        Ok(Some(record)) => {
            if let Some(answer) = answer_from_record(&record, fingerprints) {
                return answer;
            }
        }
        Ok(None) => {}
        Err(error) => return store_failed(&error),
    }
    let owned = OwnedClaim {
        scope: Arc::new(claim.scope.clone()),
        fingerprints: fingerprints.clone(),
        lease: claim.lease,
        retention: claim.retention,
        wait: config.wait,
    };
    let claim_fn: ClaimFn<K::Database> = {
        let (store, owned) = (store.clone(), owned.clone());
        Box::new(move || {
            let (store, owned) = (store.clone(), owned.clone());
            Box::pin(async move { claim_transaction(&store, &owned).await })
        })
    };
    let derived_key = DerivedKey::for_scope(&config.secret, claim.scope);
    req.extensions_mut().insert(derived_key.clone());
    let handle = IdempotentTx::<K::Database>::new(claim_fn, derived_key);
    req.extensions_mut().insert(handle.clone());
    let collected = run(inner, req, Some(config.lease), config.max_stored_body).await;
    // The handler is done (or was stopped): its transaction comes back to us. Dropping it, on
    // any path below that does not commit, rolls it back and so frees the key.
    let Some(state) = handle.take() else {
        return (
            Outcome::Released,
            internal_error("the handler kept its transaction"),
        );
    };
    let claimed = match state {
        // The key was not acquired: answer what the claim found, whatever the handler said.
        TxState::Refused(refusal) => return refusal,
        TxState::Taken => {
            return (
                Outcome::Released,
                internal_error("the transaction was taken twice"),
            );
        }
        TxState::Held(claimed) => Some(claimed),
        TxState::Unclaimed => None,
    };
    let (parts, body) = match collected {
        Ok(collected) => collected,
        Err(response) => return (Outcome::Released, response),
    };
    if releases_key(parts.status) {
        drop(claimed);
        return (
            Outcome::Released,
            Response::from_parts(parts, body.into_body()),
        );
    }
    // A handler that never locked wrote nothing: claim now, in a transaction, to store its
    // result (or answer from the row a concurrent request committed meanwhile).
    let Claimed { token, mut tx } = match claimed {
        Some(claimed) => claimed,
        None => match claim_transaction(store, &owned).await {
            Ok(claimed) => claimed,
            Err(refusal) => return refusal,
        },
    };
    let completion = completion_for(config, &parts, &body);
    match store
        .complete_in_transaction(&mut tx, claim.scope, token, &completion)
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            return (
                Outcome::Released,
                internal_error("the key's claim was lost"),
            );
        }
        Err(error) => return store_failed(&error),
    }
    if let Err(error) = tx.commit().await {
        tracing::error!(route = %claim.scope.route, %error, "commit of an idempotent request failed");
        // The commit may or may not have happened: a retry with the same key finds out.
        let problem = ProblemType::CommitFailed
            .problem()
            .with_detail("the result could not be confirmed; retry with the same Idempotency-Key")
            .with_retry_after(1);
        return (Outcome::Error, problem.into_response());
    }
    (
        Outcome::Created,
        Response::from_parts(parts, body.into_body()),
    )
}

/// What a transactional claim needs, owned (it runs inside the handler's `lock()`).
#[derive(Clone)]
struct OwnedClaim {
    scope: Arc<Scope>,
    fingerprints: Arc<Fingerprints>,
    lease: Duration,
    retention: Duration,
    wait: Duration,
}

/// Opens a transaction and claims the key in it, waiting a bounded time for a concurrent owner;
/// or the answer the key's state gives (replay, 422, 409, 503).
async fn claim_transaction<K: KeyStore>(
    store: &K,
    owned: &OwnedClaim,
) -> Result<Claimed<K::Database>, Refusal> {
    let claim = ClaimRequest {
        scope: &owned.scope,
        fingerprint: owned.fingerprints.current(),
        lease: owned.lease,
        retention: owned.retention,
    };
    let mut waiter = Waiter::new(owned.wait);
    loop {
        match store.claim_in_transaction(&claim, waiter.remaining()).await {
            Ok(Claim::Acquired { token, tx }) => return Ok(Claimed { token, tx }),
            Ok(Claim::Existing(record)) => {
                if let Some(answer) = answer_from_record(&record, &owned.fingerprints) {
                    return Err(answer);
                }
            }
            Ok(Claim::Busy) => return Err(in_use()),
            // The database as a whole is busy (SQLite's write lock held by another writer): the
            // key's committed row answers for itself; else 503.
            Err(StoreError::Busy) => {
                return Err(match store.get(&owned.scope).await {
                    Ok(Some(record)) => {
                        answer_from_record(&record, &owned.fingerprints).unwrap_or_else(in_use)
                    }
                    Ok(None) | Err(_) => store_failed(&StoreError::Busy),
                });
            }
            Err(error) => return Err(store_failed(&error)),
        }
        if !waiter.pause().await {
            return Err(in_use());
        }
    }
}

/// Runs the handler in a task of its own (a panic becomes a 500) and collects its body, at most
/// `cap + 1` bytes of it: a longer body is never buffered whole. `deadline`, if set, stops the
/// handler (and the collection) after that long (503).
async fn run<S>(
    inner: S,
    req: Request<Body>,
    deadline: Option<Duration>,
    cap: usize,
) -> Result<(http::response::Parts, Collected), Response>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    let task = tokio::spawn(
        async move {
            let response = inner.oneshot(req).await.into_response();
            let (parts, body) = response.into_parts();
            (parts, Collected::read(body, cap).await)
        }
        .in_current_span(),
    );
    let abort = task.abort_handle();
    let joined = match deadline {
        Some(limit) => match tokio::time::timeout(limit, task).await {
            Ok(joined) => joined,
            Err(_) => {
                abort.abort();
                let problem = ProblemType::RequestTimeout
                    .problem()
                    .with_detail("the request ran longer than its lease and was rolled back; retry with the same Idempotency-Key")
                    .with_retry_after(1);
                return Err(problem.into_response());
            }
        },
        None => task.await,
    };
    match joined {
        Ok((parts, Ok(collected))) => Ok((parts, collected)),
        Ok((_, Err(_))) => Err(internal_error("the response body failed")),
        Err(_) => Err(internal_error("the handler panicked")),
    }
}

/// A response body as far as the layer read it.
enum Collected {
    /// The whole body, within the stored limit.
    Whole(Bytes),
    /// Over the limit: the bytes read so far and the rest, still to be streamed to the client.
    Overflow { prefix: Bytes, rest: Body },
}

impl Collected {
    async fn read(mut body: Body, cap: usize) -> Result<Self, axum::Error> {
        use http_body_util::BodyExt;
        let mut buf = bytes::BytesMut::new();
        while let Some(frame) = body.frame().await {
            // Trailers are not stored (nor replayed).
            if let Ok(data) = frame?.into_data() {
                buf.extend_from_slice(&data);
                if buf.len() > cap {
                    return Ok(Self::Overflow {
                        prefix: buf.freeze(),
                        rest: body,
                    });
                }
            }
        }
        Ok(Self::Whole(buf.freeze()))
    }

    /// The body for the client: the collected bytes, then whatever was not read yet.
    fn into_body(self) -> Body {
        match self {
            Self::Whole(bytes) => Body::from(bytes),
            Self::Overflow { prefix, rest } => Body::new(Prefixed {
                prefix: Some(prefix),
                rest,
            }),
        }
    }
}

/// A body that yields `prefix`, then `rest`.
struct Prefixed {
    prefix: Option<Bytes>,
    rest: Body,
}

impl http_body::Body for Prefixed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(prefix))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let prefix = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(rest.lower() + prefix);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + prefix);
        }
        hint
    }
}

/// The handler rejected the request before any effect, or failed: nothing to keep.
fn releases_key(status: StatusCode) -> bool {
    status.is_server_error()
        || matches!(
            status.as_u16(),
            400 | 401 | 403 | 408 | 409 | 413 | 415 | 429
        )
}

fn completion_for(config: &Config, parts: &http::response::Parts, body: &Collected) -> Completion {
    match body {
        Collected::Whole(bytes) if bytes.len() <= config.max_stored_body => Completion::Response(
            StoredResponse::new(parts.status.as_u16(), &parts.headers, bytes.clone()),
        ),
        _ => Completion::Tombstone {
            reason: format!(
                "the response body was larger than the {} bytes stored for replay",
                config.max_stored_body
            ),
        },
    }
}

/// The answer an existing row gives, or `None` while it is in progress.
/// `fingerprints`: this request's, under the current and any previous secret.
fn answer_from_record(record: &Record, fingerprints: &Fingerprints) -> Option<(Outcome, Response)> {
    if fingerprints.position(&record.fingerprint).is_none() {
        let problem = ProblemType::KeyReused.problem().with_detail(
            "this key was used for a different request; use a new key for a new request",
        );
        return Some((Outcome::Mismatch, problem.into_response()));
    }
    match &record.state {
        RecordState::InProgress { .. } => None,
        RecordState::Completed(stored) => Some((Outcome::Replayed, replay(stored))),
        RecordState::Tombstoned { reason } => {
            let problem = ProblemType::KeyUnreplayable
                .problem()
                .with_detail(format!("the request was processed, but {reason}"));
            Some((Outcome::Replayed, problem.into_response()))
        }
    }
}

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
struct Waiter {
    deadline: Instant,
    pause: Duration,
}

impl Waiter {
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

async fn read_body(body: Body, limit: usize) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, limit).await.map_err(|error| {
        let too_large =
            std::iter::successors(Some(&error as &dyn std::error::Error), |e| e.source())
                .any(|e| e.is::<http_body_util::LengthLimitError>());
        if too_large {
            ProblemType::RequestTooLarge
                .problem()
                .with_detail(format!("the body is larger than {limit} bytes"))
                .into_response()
        } else {
            ProblemType::RequestBodyUnreadable.problem().into_response()
        }
    })
}

fn key_problem(error: &KeyError) -> Response {
    let problem = match error {
        KeyError::Missing => ProblemType::KeyMissing.problem()
            .with_detail("send an Idempotency-Key header with a unique value per operation, and reuse it on every retry"),
        other => ProblemType::KeyInvalid.problem()
            .with_detail(other.to_string()),
    };
    problem.into_response()
}

fn in_use() -> (Outcome, Response) {
    let problem = ProblemType::KeyInUse
        .problem()
        .with_detail(
            "a request with this Idempotency-Key is still being processed; retry after a moment",
        )
        .with_retry_after(1);
    (Outcome::InProgress, problem.into_response())
}

fn store_failed(error: &StoreError) -> (Outcome, Response) {
    if matches!(error, StoreError::Busy) {
        tracing::warn!(%error, "idempotency key store busy");
        let problem = ProblemType::StorageBusy
            .problem()
            .with_detail("the database was busy and the request was not processed; retry with the same Idempotency-Key")
        .with_retry_after(1);
        return (Outcome::Error, problem.into_response());
    }
    tracing::error!(%error, "idempotency key store failed");
    let problem = ProblemType::StorageUnavailable
        .problem()
        .with_detail("the request was not processed; retry with the same Idempotency-Key")
        .with_retry_after(1);
    (Outcome::Error, problem.into_response())
}

fn internal_error(detail: &str) -> Response {
    tracing::error!(detail, "idempotent request failed");
    ProblemType::InternalError
        .problem()
        .with_detail(
            "the request failed and nothing was stored; retry with the same Idempotency-Key",
        )
        .into_response()
}

async fn release_logged<K: KeyStore>(store: &K, scope: &Scope, token: crate::store::FencingToken) {
    if let Err(error) = store.release(scope, token).await {
        tracing::error!(route = %scope.route, %error, "could not release a key; it frees when its lease expires");
    }
}

/// Logs and counts the outcome, and attaches it to the response.
fn finish(
    route: &str,
    scope: Option<&Scope>,
    outcome: Outcome,
    mut response: Response,
) -> Response {
    metrics::counter!(
        "oncely_idempotency_requests_total",
        "outcome" => outcome.as_str(),
        "route" => route.to_owned()
    )
    .increment(1);
    tracing::info!(
        idempotency_outcome = outcome.as_str(),
        route,
        tenant = scope.map(|s| s.tenant.as_str()),
        status = response.status().as_u16(),
        "idempotent request"
    );
    response.extensions_mut().insert(outcome);
    response
}
