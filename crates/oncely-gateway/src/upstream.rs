//! Forwarding to the upstream: the request rewritten as a proxy must (hop-by-hop headers
//! dropped per RFC 9110 §7.6.1, `X-Forwarded-*` added), the answer streamed back — or, on a
//! protected route, read whole up to the stored limit so that an answer cut short is known as
//! such — and every failure told apart: nothing sent (the key is released), or sent and the
//! answer lost (the key is kept: the upstream may have acted).

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Uri};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use oncely::key::IDEMPOTENCY_KEY;
use oncely::{DerivedKey, OutcomeUnknown};

use super::GatewayProblem;

/// The application behind the gateway, and how to reach it.
#[derive(Clone)]
pub struct Upstream {
    /// Pooled: for requests passed through.
    client: Client<HttpConnector, Body>,
    /// A fresh connection per request: for protected requests. A pooled connection the
    /// application is closing at that moment (Node closes idle ones after 5 s) fails the
    /// request after it was written, which would read as "the application may have acted" and
    /// keep the key for nothing.
    fresh: Client<HttpConnector, Body>,
    /// `http://host:port`.
    origin: String,
    /// The base path, without a trailing slash (`""` or `/api`).
    base_path: String,
    timeout: Duration,
    forward_key: HeaderName,
    /// The most of a protected answer read before it is streamed (the stored limit + 1).
    read_limit: usize,
}

/// Why no answer came back.
enum Failure {
    /// Nothing reached the upstream (it refused the connection, or none could be made).
    NotSent(String),
    /// The request was sent; its answer did not come back whole.
    Lost(String),
    /// No whole answer within the timeout.
    TimedOut,
}

impl Upstream {
    /// Checks `url` (`http://host:port[/base]`) and builds the client.
    pub fn new(
        url: &str,
        timeout: Duration,
        forward_key: HeaderName,
        max_stored_body: usize,
    ) -> Result<Self, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("--upstream {url:?} is not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "--upstream {url:?}: the gateway speaks plain HTTP to its upstream (http://host:port); run it beside the application"
            ));
        }
        let Some(authority) = uri.authority() else {
            return Err(format!("--upstream {url:?} names no host"));
        };
        if authority.as_str().contains('@') {
            return Err(format!(
                "--upstream {url:?}: no user or password in the URL"
            ));
        }
        if authority.host().is_empty() {
            return Err(format!("--upstream {url:?} names no host"));
        }
        if uri.query().is_some() {
            return Err(format!("--upstream {url:?}: no query in the URL"));
        }
        if super::routes::ambiguous(uri.path()).is_some() || uri.path().contains("/.") {
            return Err(format!(
                "--upstream {url:?}: the base path must be plain (no '.' segments, escapes or ';')"
            ));
        }
        let base_path = uri.path().trim_end_matches('/').to_owned();
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(2))
            .build(connector.clone());
        let fresh = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        Ok(Self {
            client,
            fresh,
            origin: format!("http://{authority}"),
            base_path,
            timeout,
            forward_key,
            read_limit: max_stored_body.saturating_add(1),
        })
    }

    /// How long it waits for an answer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The upstream's origin (`http://host:port`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// An unprotected request: forwarded, its answer streamed back as it comes.
    pub async fn pass(&self, mut req: Request<Body>) -> Response {
        // The forwarded-key header comes from the gateway only: the application may trust it.
        req.headers_mut().remove(&self.forward_key);
        let Some(req) = self.rewrite(req) else {
            return unforwardable();
        };
        match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Ok(Ok(response)) => answer(response.map(Body::new)),
            Ok(Err(error)) => self.failed(classify(&error), false),
            Err(_) => self.failed(Failure::TimedOut, false),
        }
    }

    /// A protected request (behind the idempotency layer, which set its [`DerivedKey`]): the
    /// key is forwarded, and the answer read whole (up to the stored limit) within the
    /// timeout. An answer lost after the request was sent is marked [`OutcomeUnknown`], so the
    /// layer keeps the key.
    pub async fn protected(&self, req: Request<Body>) -> Response {
        let derived = req.extensions().get::<DerivedKey>().cloned();
        // After the hop-by-hop headers are gone, so that no `Connection` can name them away.
        let Some(mut req) = self.rewrite(req) else {
            return unforwardable();
        };
        let headers = req.headers_mut();
        // The client's key is the gateway's: the upstream gets the derived key, unique per
        // tenant, route and key, in its header.
        headers.remove(IDEMPOTENCY_KEY);
        headers.remove(&self.forward_key);
        if let Some(derived) = derived
            && let Ok(value) = HeaderValue::from_str(derived.as_str())
        {
            headers.insert(self.forward_key.clone(), value);
        }
        // An answer that is stored is replayed with its allow-listed headers only: it must not
        // depend on a Content-Encoding the replay would drop.
        headers.remove(header::ACCEPT_ENCODING);
        let exchange = async {
            let response = self.fresh.request(req).await.map_err(|e| classify(&e))?;
            let (parts, body) = response.into_parts();
            let body = read_up_to(Body::new(body), self.read_limit).await?;
            Ok::<_, Failure>(answer(Response::from_parts(parts, body)))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(response)) => response,
            Ok(Err(failure)) => self.failed(failure, true),
            Err(_) => self.failed(Failure::TimedOut, true),
        }
    }

    /// The request as the upstream gets it; `None` if its target cannot be one (not seen: the
    /// origin and base path were checked at start, and the path came in as a valid URI).
    fn rewrite(&self, req: Request<Body>) -> Option<Request<Body>> {
        let (mut parts, body) = req.into_parts();
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let uri = format!("{}{}{}", self.origin, self.base_path, path_and_query);
        let uri = uri.parse::<Uri>().ok()?;
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| addr.ip());
        let headers = &mut parts.headers;
        remove_hop_by_hop(headers);
        headers.remove(header::PROXY_AUTHORIZATION);
        // The gateway speaks X-Forwarded-*: a client's own `Forwarded` or `X-Real-IP` would be
        // believed by applications that prefer them.
        headers.remove(header::FORWARDED);
        headers.remove(REAL_IP);
        // The upstream's Host is its own; the client's is X-Forwarded-Host.
        // (A client's own X-Forwarded-Host never passes, with or without a Host.)
        headers.remove(FORWARDED_HOST);
        if let Some(host) = headers.remove(header::HOST) {
            headers.insert(FORWARDED_HOST, host);
        }
        headers.insert(FORWARDED_PROTO, HeaderValue::from_static("http"));
        if let Some(peer) = peer {
            let chain = match headers.get(FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
                Some(earlier) => format!("{earlier}, {peer}"),
                None => peer.to_string(),
            };
            if let Ok(value) = HeaderValue::from_str(&chain) {
                headers.insert(FORWARDED_FOR, value);
            }
        }
        let mut forwarded = Request::new(body);
        *forwarded.method_mut() = parts.method;
        *forwarded.uri_mut() = uri;
        *forwarded.headers_mut() = parts.headers;
        Some(forwarded)
    }

    /// The answer when the upstream gave none. `protected`: an answer lost after the request
    /// was sent is marked [`OutcomeUnknown`].
    fn failed(&self, failure: Failure, protected: bool) -> Response {
        let (problem, detail, unknown) = match failure {
            Failure::NotSent(why) => (
                GatewayProblem::UpstreamUnavailable,
                format!(
                    "the upstream at {} could not be reached ({why}); nothing was sent to it, retry with the same Idempotency-Key",
                    self.origin
                ),
                None,
            ),
            Failure::Lost(why) => (
                GatewayProblem::UpstreamOutcomeUnknown,
                format!(
                    "the request reached the upstream, but its answer was lost ({why}); it may have acted"
                ),
                Some(format!("its answer from the upstream was lost ({why})")),
            ),
            Failure::TimedOut => (
                GatewayProblem::UpstreamTimeout,
                format!(
                    "the upstream did not answer within {}; it may still act",
                    humantime::format_duration(self.timeout)
                ),
                Some(format!(
                    "the upstream did not answer within {}",
                    humantime::format_duration(self.timeout)
                )),
            ),
        };
        tracing::warn!(upstream = %self.origin, problem = problem.slug(), %detail, "upstream failed");
        let mut response = problem.answer(&detail);
        if protected && let Some(reason) = unknown {
            response
                .extensions_mut()
                .insert(OutcomeUnknown::new(reason));
        }
        response
    }
}

/// 400: a target that cannot be forwarded.
fn unforwardable() -> Response {
    GatewayProblem::RequestAmbiguous.answer("the path cannot be forwarded as it is")
}

const REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// The upstream's answer as the client gets it: hop-by-hop headers dropped.
fn answer(mut response: Response) -> Response {
    remove_hop_by_hop(response.headers_mut());
    response.headers_mut().remove(header::PROXY_AUTHENTICATE);
    response
}

/// Drops the headers that belong to one connection (RFC 9110 §7.6.1): those `Connection`
/// names, and `Connection`, `Proxy-Connection`, `Keep-Alive`, `TE`, `Transfer-Encoding`,
/// `Upgrade`. (So upgrades — WebSocket — do not pass.)
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("proxy-connection"),
        HeaderName::from_static("keep-alive"),
        header::TE,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

/// Whether anything was sent: a failure to connect sent nothing.
fn classify(error: &hyper_util::client::legacy::Error) -> Failure {
    let why = std::iter::successors(Some(error as &dyn std::error::Error), |e| e.source())
        .last()
        .map_or_else(|| error.to_string(), ToString::to_string);
    if error.is_connect() {
        Failure::NotSent(why)
    } else {
        Failure::Lost(why)
    }
}

/// The body read whole if it is at most `limit - 1` bytes; a longer one as the bytes read so
/// far followed by the rest, streamed (never buffered whole). A body that fails before its
/// end is lost.
async fn read_up_to(mut body: Body, limit: usize) -> Result<Body, Failure> {
    let mut read = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Failure::Lost(format!("its answer was cut off: {e}")))?;
        if let Ok(data) = frame.into_data() {
            read.extend_from_slice(&data);
            if read.len() >= limit {
                let head =
                    futures::stream::once(async move { Ok::<Bytes, axum::Error>(read.freeze()) });
                return Ok(Body::from_stream(head.chain(body.into_data_stream())));
            }
        }
    }
    Ok(Body::from(read.freeze()))
}
