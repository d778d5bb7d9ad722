//! `oncely gateway`: the Idempotency-Key contract in front of an HTTP application written in
//! anything — a reverse proxy that runs the idempotency layer's generic mode on the routes the
//! operator names, and passes every other request through, streamed.
//!
//! - [`routes`]: the protected routes (`METHOD /path/{param}`), how a path matches one, and the
//!   paths refused because an application could read them as another path.
//! - [`upstream`]: forwarding — hop-by-hop headers, `X-Forwarded-*`, the derived key in the
//!   upstream's header, and failures told apart (nothing sent: the key is released; sent and
//!   the answer lost: the key is kept).
//! - [`start`]: its own start-up — the key store's migrations alone, the shared server secret.
//! - here: the scope (the tenant from a trusted header, or the caller's credential hashed),
//!   the router, and `serve`.
//!
//! Its database is an oncely database (`oncely migrate`, `oncely prune` and `oncely key show`
//! work on it); it keeps only idempotency keys and the shared secret's check there.

pub mod overrides;
pub mod routes;
pub mod start;
pub mod upstream;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use oncely::layer::{IdempotencyService, RouteTemplate};
use oncely::store::KeyStore;
use oncely::{IdempotencyKey, IdempotencyLayer, Problem, Scope, ServerSecret, TenantId};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

pub use routes::{Route, Routes};
pub use upstream::Upstream;

/// The problems the gateway itself answers with (the layer's are `oncely`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayProblem {
    /// The upstream could not be reached; nothing was sent to it (the key is free).
    UpstreamUnavailable,
    /// The request reached the upstream, but its answer was lost (the key is kept).
    UpstreamOutcomeUnknown,
    /// The upstream did not answer in time (the key is kept).
    UpstreamTimeout,
    /// A request an application could read as another: a path with `..` or an encoded `/`, a
    /// protected method in lower case.
    RequestAmbiguous,
    /// The trusted tenant header holds no valid tenant.
    TenantInvalid,
    /// As many protected requests as allowed are in flight.
    Busy,
    /// The client did not send the body in time.
    RequestTimeout,
}

impl GatewayProblem {
    /// Every one, in the order docs/gateway.md lists them.
    pub const ALL: &[Self] = &[
        Self::UpstreamUnavailable,
        Self::UpstreamOutcomeUnknown,
        Self::UpstreamTimeout,
        Self::RequestAmbiguous,
        Self::TenantInvalid,
        Self::Busy,
        Self::RequestTimeout,
    ];

    /// The last segment of its `type` URI.
    pub const fn slug(self) -> &'static str {
        match self {
            Self::UpstreamUnavailable => "upstream-unavailable",
            Self::UpstreamOutcomeUnknown => "upstream-outcome-unknown",
            Self::UpstreamTimeout => "upstream-timeout",
            Self::RequestAmbiguous => "request-ambiguous",
            Self::TenantInvalid => "tenant-invalid",
            Self::Busy => "gateway-busy",
            Self::RequestTimeout => "request-body-timeout",
        }
    }

    /// Its HTTP status.
    pub const fn status(self) -> StatusCode {
        match self {
            Self::UpstreamUnavailable | Self::UpstreamOutcomeUnknown => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::RequestAmbiguous | Self::TenantInvalid => StatusCode::BAD_REQUEST,
            Self::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        }
    }

    /// Its title.
    pub const fn title(self) -> &'static str {
        match self {
            Self::UpstreamUnavailable => "Upstream unavailable",
            Self::UpstreamOutcomeUnknown => "Upstream outcome unknown",
            Self::UpstreamTimeout => "Upstream timed out",
            Self::RequestAmbiguous => "Ambiguous request",
            Self::TenantInvalid => "Invalid tenant",
            Self::Busy => "Gateway busy",
            Self::RequestTimeout => "Request body too slow",
        }
    }

    /// A problem of this type, without detail (with `Retry-After` where a retry can work).
    pub fn problem(self) -> Problem {
        let problem = Problem::new(self.status(), self.slug(), self.title());
        match self {
            Self::UpstreamUnavailable | Self::Busy => problem.with_retry_after(1),
            _ => problem,
        }
    }
}

/// Whose keys a request uses.
#[derive(Debug, Clone)]
pub struct Scoping {
    /// A header a trusted proxy sets to the tenant.
    pub tenant_header: Option<HeaderName>,
    /// The header that holds the caller's credential.
    pub credential_header: HeaderName,
    /// A cookie that holds it, when the header is absent.
    pub credential_cookie: Option<String>,
}

/// Everything `oncely gateway` was told, checked.
#[derive(Clone)]
pub struct Plan {
    /// The protected routes.
    pub routes: Routes,
    /// The application behind the gateway.
    pub upstream: Upstream,
    /// Whose keys a request uses.
    pub scoping: Scoping,
    /// The layer's lease.
    pub lease: Duration,
    /// How long results replay.
    pub retention: Duration,
    /// Bytes of finished keys kept in memory (0: none).
    pub replay_cache_bytes: u64,
    /// The largest request body of a protected route.
    pub max_request_body: usize,
    /// The largest answer stored for replay.
    pub max_stored_body: usize,
    /// The most protected requests in flight.
    pub max_in_flight: usize,
    /// How long a client may take to send a protected request's body.
    pub body_timeout: Duration,
    /// The routes (a request's own method and path) where a method override is let through
    /// unless it names a protected method.
    pub allow_method_override: Vec<Route>,
}

/// The protected path: the idempotency layer around the forwarding.
type Protected<K> = IdempotencyService<BoxCloneSyncService<Request<Body>, Response, Infallible>, K>;

struct Gateway<K> {
    in_flight: Arc<tokio::sync::Semaphore>,
    work: tokio_util::task::TaskTracker,
    plan: Plan,
    keys: K,
    secret: ServerSecret,
    protected: Protected<K>,
}

/// The gateway's routes: everything, protected or passed through. Each protected request runs
/// in a task of `work` (wait for it before the process exits).
pub fn router<K: KeyStore>(
    keys: K,
    secret: ServerSecret,
    plan: Plan,
    work: &tokio_util::task::TaskTracker,
) -> Router {
    let upstream = plan.upstream.clone();
    let forward = tower::service_fn(move |req: Request<Body>| {
        let upstream = upstream.clone();
        async move { Ok::<_, Infallible>(upstream.protected(req).await) }
    });
    let protected = IdempotencyLayer::generic(keys.clone(), secret.clone())
        .lease(plan.lease)
        .retention(plan.retention)
        .max_request_body(plan.max_request_body)
        .max_stored_body(plan.max_stored_body);
    let protected = match plan.replay_cache_bytes {
        0 => protected,
        bytes => protected.replay_cache(&oncely::ReplayCache::new(bytes)),
    }
    .layer(BoxCloneSyncService::new(forward));
    let gateway = Arc::new(Gateway {
        in_flight: Arc::new(tokio::sync::Semaphore::new(plan.max_in_flight)),
        work: work.clone(),
        plan,
        keys,
        secret,
        protected,
    });
    Router::new().fallback(entry::<K>).with_state(gateway)
}

async fn entry<K: KeyStore>(
    State(gateway): State<Arc<Gateway<K>>>,
    req: Request<Body>,
) -> Response {
    let routes = &gateway.plan.routes;
    // Where a protected route could be meant, a path the upstream might resolve otherwise
    // (`/x/../signup`, `/orders%2F1/pay`) is refused, so nothing reaches a protected route
    // unprotected.
    if routes.iter().any(|r| r.method() == req.method())
        && let Some(why) = routes::ambiguous(req.uri().path())
    {
        return GatewayProblem::RequestAmbiguous.answer(&format!(
            "the path has {why}, which an application could read as another path; send it plainly"
        ));
    }
    // `post` is not `POST` here, but some applications take it for one.
    let method = req.method().as_str();
    if method.bytes().any(|b| b.is_ascii_lowercase())
        && routes
            .iter()
            .any(|r| r.method().as_str().eq_ignore_ascii_case(method))
    {
        return GatewayProblem::RequestAmbiguous.answer(
            "methods are upper case: an application could take this one for a protected one",
        );
    }
    // A request that names another method (Rails, Laravel, Symfony, Spring and Express'
    // method-override turn a POST into it) is refused, however it names it (overrides.rs).
    let req = match method_override(&gateway, req).await {
        Ok(req) => req,
        Err(refused) => return refused,
    };
    let Some(route) = routes.matching(req.method(), req.uri().path()) else {
        return gateway.plan.upstream.pass(req).await;
    };
    // Protected requests in flight are bounded (each holds up to --max-request-body), and so
    // is the time a client takes to send a body: nobody holds the gateway's memory for long.
    let Ok(slot) = gateway.in_flight.clone().try_acquire_owned() else {
        return GatewayProblem::Busy.answer(&format!(
            "{} protected requests are in flight; retry with the same Idempotency-Key",
            gateway.plan.max_in_flight
        ));
    };
    // In a task of its own that holds the slot to the end: a client that hangs up neither
    // frees the slot while its request still runs, nor lets a shutdown drop the request
    // between the upstream's effect and the stored answer (the shutdown waits for `work`).
    let route = route.clone();
    let work = gateway.work.spawn({
        let gateway = gateway.clone();
        async move {
            let answer = protect(&gateway, &route, req).await;
            drop(slot);
            answer
        }
    });
    work.await.unwrap_or_else(|_| {
        GatewayProblem::UpstreamOutcomeUnknown.answer("the gateway's request task failed")
    })
}

/// `req`, unless it names a method besides its own (overrides.rs): then 400
/// `request-ambiguous` — on a route of `--allow-method-override` only if a method it names is
/// protected at its path. Where a protected route's path is (elsewhere no override reaches
/// one, and bodies stream), the body is read too, up to `--max-request-body`; a request that is
/// not itself protected there is refused the same way if the gateway cannot read its body as
/// the application would (encoded, another charset, JSON it cannot parse): what it cannot
/// read, it cannot clear.
async fn method_override<K: KeyStore>(
    gateway: &Gateway<K>,
    req: Request<Body>,
) -> Result<Request<Body>, Response> {
    let routes = &gateway.plan.routes;
    let path = req.uri().path().to_owned();
    let mut named = overrides::in_head(req.headers(), req.uri().query());
    let req = match routes.at_path(&path) {
        true => {
            let (parts, body) = read_body(gateway, req).await?.into_parts();
            let header = |name| {
                parts
                    .headers
                    .get(name)
                    .map(|v: &http::HeaderValue| String::from_utf8_lossy(v.as_bytes()))
            };
            let encoding = header(http::header::CONTENT_ENCODING);
            let content_type = header(http::header::CONTENT_TYPE);
            // A protected request goes through the layer whatever its body says: only another
            // method's request must be cleared.
            let protected = routes.matching(&parts.method, &path).is_some();
            match overrides::in_body(encoding.as_deref(), content_type.as_deref(), &body) {
                Ok(in_body) => named.extend(in_body),
                Err(_) if protected => {}
                Err(unreadable) => {
                    return Err(GatewayProblem::RequestAmbiguous.answer(&format!(
                        "{unreadable} where a protected route is: the gateway cannot tell whether it names another method; send it plainly"
                    )));
                }
            }
            Request::from_parts(parts, Body::from(body))
        }
        false => req,
    };
    if named.is_empty() {
        return Ok(req);
    }
    let allowed = gateway
        .plan
        .allow_method_override
        .iter()
        .any(|route| route.matches(req.method(), &path));
    if allowed && !overrides::names_protected(&named, &path, routes) {
        return Ok(req);
    }
    Err(GatewayProblem::RequestAmbiguous.answer(
        "the request names another method (an X-HTTP-Method-Override, X-HTTP-Method or X-Method-Override header, or a _method parameter), which an application could act on unprotected: send the method itself",
    ))
}

/// `req` with its body read: at most `--max-request-body` (413 beyond), within
/// `--body-timeout` (408 past it).
async fn read_body<K: KeyStore>(
    gateway: &Gateway<K>,
    req: Request<Body>,
) -> Result<Request<Bytes>, Response> {
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let limit = gateway.plan.max_request_body;
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(too_large(limit));
    }
    let (parts, body) = req.into_parts();
    let deadline = gateway.plan.body_timeout;
    match tokio::time::timeout(deadline, oncely::layer::read_body(body, limit)).await {
        Ok(Ok(bytes)) => Ok(Request::from_parts(parts, bytes)),
        Ok(Err(refused)) => Err(refused),
        Err(_) => Err(GatewayProblem::RequestTimeout.answer(&format!(
            "the body did not arrive within {}",
            humantime::format_duration(deadline)
        ))),
    }
}

/// A protected request: its body read (bounded), its tenant and route named, then the layer.
async fn protect<K: KeyStore>(gateway: &Gateway<K>, route: &Route, req: Request<Body>) -> Response {
    let (parts, body) = match read_body(gateway, req).await {
        Ok(req) => req.into_parts(),
        Err(refused) => return refused,
    };
    let mut req = Request::from_parts(parts, Body::from(body));
    let tenant = match gateway.tenant(req.headers(), route).await {
        Ok(tenant) => tenant,
        Err(answer) => return answer,
    };
    req.extensions_mut().insert(tenant);
    req.extensions_mut()
        .insert(RouteTemplate::new(route.template()));
    match gateway.protected.clone().oneshot(req).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// 413: the body is over `limit` (declared so, or found so).
fn too_large(limit: usize) -> Response {
    oncely::problem::ProblemType::RequestTooLarge
        .problem()
        .with_detail(format!("the body is larger than {limit} bytes"))
        .into_response()
}

impl<K: KeyStore> Gateway<K> {
    /// The tenant: the trusted header's; else the credential's (a keyed hash); else the
    /// shared anonymous tenant.
    async fn tenant(&self, headers: &HeaderMap, route: &Route) -> Result<TenantId, Response> {
        let scoping = &self.plan.scoping;
        if let Some(name) = &scoping.tenant_header
            && let Some(value) = headers.get(name)
        {
            return value
                .to_str()
                .ok()
                .filter(|v| !v.is_empty())
                .and_then(|v| TenantId::parse(format!("{HEADER_TENANT_PREFIX}{v}")).ok())
                .ok_or_else(|| {
                    GatewayProblem::TenantInvalid.answer(&format!(
                        "{name} must be 1-{} characters of A-Z a-z 0-9 - _ . :",
                        128 - HEADER_TENANT_PREFIX.len()
                    ))
                });
        }
        let Some(credential) = credential(headers, scoping) else {
            return Ok(anonymous());
        };
        let current = credential_tenant(&self.secret, credential);
        // During a secret rotation, a key first used under a previous secret keeps the tenant
        // that secret made: its retries replay rather than run again.
        if let Ok(key) = IdempotencyKey::from_headers(headers) {
            for previous in self.secret.previous() {
                let tenant = credential_tenant(previous, credential);
                let scope = Scope::new(
                    tenant.clone(),
                    route.method().as_str(),
                    route.template(),
                    key.clone(),
                );
                if let Ok(Some(_)) = self.keys.get(&scope).await {
                    return Ok(tenant);
                }
            }
        }
        Ok(current)
    }
}

/// The caller's credential: the credential header's value, else the credential cookie's.
fn credential<'a>(headers: &'a HeaderMap, scoping: &Scoping) -> Option<&'a [u8]> {
    if let Some(value) = headers.get(&scoping.credential_header)
        && !value.is_empty()
    {
        return Some(value.as_bytes());
    }
    let name = scoping.credential_cookie.as_deref()?;
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, v)| *n == name && !v.is_empty())
        .map(|(_, v)| v.as_bytes())
}

/// Every tenant of the gateway starts with this: its keys never meet those of an `oncely serve`
/// on the same database (whose tenants `oncely tenant create` makes, never with this prefix).
pub const TENANT_PREFIX: &str = "gateway:";

/// The tenants a trusted header names start with this, and no other tenant of the gateway
/// does: whatever a header says, its keys never meet the anonymous caller's or a credential's
/// (`anonymous` or `credential-<hex>` in the header is `gateway:tenant:anonymous`, …).
pub const HEADER_TENANT_PREFIX: &str = "gateway:tenant:";

/// The tenant of requests with no credential.
fn anonymous() -> TenantId {
    TenantId::parse(format!("{TENANT_PREFIX}anonymous")).expect("a valid tenant id")
}

/// The tenant of a credential: 128 bits of a keyed hash (the credential is never stored, and
/// logs show only `gateway:credential-…`).
fn credential_tenant(secret: &ServerSecret, credential: &[u8]) -> TenantId {
    let mac = secret.mac("oncely-gateway-credential", &[credential]);
    TenantId::with_secret_suffix(
        &format!("{TENANT_PREFIX}credential-"),
        &hex::encode(&mac[..16]),
    )
    .expect("a hex digest is a valid tenant id")
}

impl GatewayProblem {
    /// The answer, with `detail`.
    pub(crate) fn answer(self, detail: &str) -> Response {
        self.problem().with_detail(detail).into_response()
    }
}

/// Serves the gateway on `listener` with the keys in `keys` until `shutdown`: prints what it
/// protects, prunes expired keys every 10 minutes, and on shutdown lets the requests in flight
/// finish (their answers are stored first). `database`: the backend's name, for the banner.
pub async fn serve<K: KeyStore>(
    listener: tokio::net::TcpListener,
    keys: K,
    secret: ServerSecret,
    plan: Plan,
    (header_timeout, database): (Duration, &str),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    println!(
        "oncely gateway: http://{addr} -> {} (keys in {database})",
        plan.upstream.origin(),
    );
    for route in plan.routes.iter() {
        println!("  protects {route}");
    }
    println!("  every other request passes through");
    tracing::info!(%addr, upstream = plan.upstream.origin(), "oncely gateway is serving");
    let pruner = tokio::spawn(prune_periodically(keys.clone()));
    // On shutdown a connection gets this long to finish (a stream passed through may never).
    let grace = plan.upstream.timeout() + Duration::from_secs(5);
    let work = tokio_util::task::TaskTracker::new();
    let app = router(keys, secret, plan, &work);
    serve_bounded(listener, app, header_timeout, grace, shutdown).await;
    // Protected requests whose clients hung up still run: their answers are stored first.
    work.close();
    if tokio::time::timeout(grace, work.wait()).await.is_err() {
        tracing::warn!(
            "protected requests still running at exit; their keys free when their leases end"
        );
    }
    pruner.abort();
    Ok(())
}

/// Serves `app` on `listener` (HTTP/1.1) until `shutdown`, then lets the requests in flight
/// finish (for at most `grace`). A client that does not send a request's head within `header_timeout` is
/// disconnected (axum's `serve` waits for ever). Each request carries the peer's
/// `ConnectInfo`.
pub async fn serve_bounded(
    listener: tokio::net::TcpListener,
    app: Router,
    header_timeout: Duration,
    grace: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let (stop, stopping) = tokio::sync::watch::channel(());
    let connections = tokio_util::task::TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, most likely: wait a moment rather than spin.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = app
            .clone()
            .map_request(move |req: Request<hyper::body::Incoming>| {
                let mut req = req.map(Body::new);
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                req
            });
        let mut stopping = stopping.clone();
        connections.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let connection =
                builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stopping.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    drop(listener);
    let _ = stop.send(());
    connections.close();
    if tokio::time::timeout(grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            "connections still open {} after the shutdown began: closed",
            humantime::format_duration(grace)
        );
    }
}

/// Keys deleted per statement when pruning (as `oncely prune`).
const PRUNE_BATCH: u32 = 500;

/// Deletes expired keys every 10 minutes, in small batches.
async fn prune_periodically<K: KeyStore>(keys: K) {
    loop {
        tokio::time::sleep(Duration::from_secs(600)).await;
        match oncely::store::prune_all(&keys, PRUNE_BATCH).await {
            Ok(0) => {}
            Ok(pruned) => tracing::info!(pruned, "pruned expired idempotency keys"),
            Err(error) => tracing::warn!(%error, "pruning expired idempotency keys failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scoping(cookie: Option<&str>) -> Scoping {
        Scoping {
            tenant_header: None,
            credential_header: HeaderName::from_static("authorization"),
            credential_cookie: cookie.map(str::to_owned),
        }
    }

    #[test]
    fn the_credential_is_the_header_else_the_cookie() {
        let mut headers = HeaderMap::new();
        assert_eq!(credential(&headers, &scoping(Some("sid"))), None);
        headers.insert("cookie", "a=1; sid=s3cr3t; b=2".parse().unwrap());
        assert_eq!(
            credential(&headers, &scoping(Some("sid"))),
            Some(&b"s3cr3t"[..])
        );
        assert_eq!(credential(&headers, &scoping(None)), None);
        headers.insert("authorization", "Bearer k1".parse().unwrap());
        assert_eq!(
            credential(&headers, &scoping(Some("sid"))),
            Some(&b"Bearer k1"[..])
        );
    }

    #[test]
    fn two_credentials_are_two_tenants_and_neither_shows_in_it() {
        let secret = ServerSecret::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap();
        let a = credential_tenant(&secret, b"Bearer key-a");
        let b = credential_tenant(&secret, b"Bearer key-b");
        assert_ne!(a, b);
        assert_eq!(a, credential_tenant(&secret, b"Bearer key-a"));
        assert!(!a.as_str().contains("key-a"));
        let other = ServerSecret::new(b"fedcba9876543210fedcba9876543210".to_vec()).unwrap();
        assert_ne!(a, credential_tenant(&other, b"Bearer key-a"), "keyed");
    }
}
