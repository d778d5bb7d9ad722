//! `oncely gateway` in front of upstreams in this process: the contract on the routes it
//! protects, everything else passed through, and every way an upstream can fail.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use oncely_cli::cli::{Cli, Command};

use oncely_testdb::TestSqlite;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{SECRET, secret};

/// An upstream in this process: it counts the requests that reached each route and keeps the
/// headers of each.
#[derive(Clone, Default)]
struct Upstream {
    calls: Arc<AtomicUsize>,
    /// The peer port of each `/pay` call: one per connection.
    ports: Arc<Mutex<Vec<u16>>>,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
    release: Arc<tokio::sync::Notify>,
}

impl Upstream {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    fn last_seen(&self) -> HeaderMap {
        self.seen.lock().unwrap().last().cloned().unwrap()
    }
    fn record(&self, headers: &HeaderMap) -> usize {
        self.seen.lock().unwrap().push(headers.clone());
        self.calls.fetch_add(1, Ordering::SeqCst) + 1
    }
}

#[derive(serde::Deserialize)]
struct Slow {
    ms: u64,
}

async fn pay(
    State(up): State<Upstream>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let n = up.record(&headers);
    if let Some(axum::Extension(axum::extract::ConnectInfo(peer))) = peer {
        up.ports.lock().unwrap().push(peer.port());
    }
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned());
    (
        StatusCode::CREATED,
        [
            ("location", format!("/payments/{n}")),
            ("set-cookie", format!("session=s{n}")),
            ("connection", "x-hop-answer".to_owned()),
            ("x-hop-answer", "secret".to_owned()),
        ],
        Json(json!({"n": n, "key": key, "body": body})),
    )
        .into_response()
}

async fn fail(State(up): State<Upstream>, headers: HeaderMap) -> StatusCode {
    up.record(&headers);
    StatusCode::SERVICE_UNAVAILABLE
}

async fn slow(State(up): State<Upstream>, headers: HeaderMap, Query(q): Query<Slow>) -> Response {
    let n = up.record(&headers);
    tokio::time::sleep(Duration::from_millis(q.ms)).await;
    (StatusCode::CREATED, Json(json!({"n": n}))).into_response()
}

async fn big(State(up): State<Upstream>, headers: HeaderMap) -> String {
    up.record(&headers);
    "x".repeat(5000)
}

async fn echo(State(up): State<Upstream>, headers: HeaderMap) -> Response {
    up.record(&headers);
    (
        [("connection", "x-hop-answer"), ("x-hop-answer", "secret")],
        "echoed",
    )
        .into_response()
}

/// A streamed answer: its first chunk now, the second once the test releases it.
async fn stream(State(up): State<Upstream>) -> Response {
    let release = up.release.clone();
    let chunks = futures::stream::once(async { Ok::<_, std::io::Error>("first\n") }).chain(
        futures::stream::once(async move {
            release.notified().await;
            Ok("second\n")
        }),
    );
    axum::body::Body::from_stream(chunks).into_response()
}

use futures::StreamExt;

async fn start_upstream() -> (String, Upstream) {
    let up = Upstream::default();
    let app = Router::new()
        .route("/pay", post(pay))
        .route("/orders/{id}/pay", post(pay))
        .route("/fail", post(fail))
        .route("/slow", post(slow))
        .route("/big", post(big))
        .route("/echo", post(echo))
        .route("/stream", get(stream))
        .with_state(up.clone());
    (serve(app).await, up)
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap()
    });
    format!("http://{addr}")
}

/// The gateway in this process in front of `upstream`, as `oncely gateway <args>` configures
/// it, on a fresh SQLite database; protects `POST /pay`, `/orders/{id}/pay`, `/fail`,
/// `/slow`, `/big`.
async fn start_gateway(upstream: &str, args: &[&str]) -> (String, TestSqlite) {
    let db = TestSqlite::new();
    let base = start_gateway_on(db.url(), secret(SECRET), upstream, args).await;
    (base, db)
}

/// [`start_gateway`] on database `url`, with `secret` (and its ring).
async fn start_gateway_on(
    url: &str,
    secret: oncely::ServerSecret,
    upstream: &str,
    args: &[&str],
) -> String {
    let mut argv = vec![
        "oncely",
        "gateway",
        "--upstream",
        upstream,
        "--route",
        "POST /pay",
        "--route",
        "POST /orders/{id}/pay",
        "--route",
        "POST /fail",
        "--route",
        "POST /slow",
        "--route",
        "POST /big",
    ];
    argv.extend_from_slice(args);
    let Command::Gateway(args) = Cli::try_parse_from(argv).unwrap().command else {
        unreachable!()
    };
    let plan = args.plan().unwrap();
    let (keys, secret) = oncely_gateway::start::open::<sqlx::Sqlite>(
        &oncely_sql::open::Location::url(url),
        4,
        oncely_gateway::start::Schemas::Migrate,
        (secret, None),
    )
    .await
    .unwrap();
    let app = oncely_gateway::router(keys, secret, plan, &tokio_util::task::TaskTracker::new());
    serve(app).await
}

struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
    #[track_caller]
    fn assert_problem(&self, status: u16, slug: &str) {
        assert_eq!(self.status.as_u16(), status, "{}", self.body);
        assert_eq!(
            self.json()["type"],
            format!("https://oncely.dev/problems/{slug}"),
            "{}",
            self.body
        );
    }
}

async fn post_to(url: &str, key: Option<&str>, body: &str, headers: &[(&str, &str)]) -> Answer {
    let mut req = oncely_testdb::http().post(url).body(body.to_owned());
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("content-type"))
    {
        req = req.header("content-type", "application/json");
    }
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let response = req.send().await.unwrap();
    Answer {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.text().await.unwrap(),
    }
}

fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[tokio::test]
async fn retries_and_concurrent_duplicates_reach_the_upstream_once() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(&upstream, &[]).await;
    let key = new_key();
    let first = post_to(&format!("{gw}/pay"), Some(&key), r#"{"amount":10}"#, &[]).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert_eq!(first.headers["set-cookie"], "session=s1");
    assert!(!first.replayed());
    let forwarded = first.json()["key"].as_str().unwrap().to_owned();
    assert_ne!(
        forwarded, key,
        "the upstream gets the derived key, not the client's"
    );
    for _ in 0..20 {
        let retry = post_to(&format!("{gw}/pay"), Some(&key), r#"{ "amount": 10 }"#, &[]).await;
        assert_eq!(retry.status, StatusCode::CREATED);
        assert!(retry.replayed());
        assert_eq!(retry.body, first.body);
        assert_eq!(retry.headers["location"], "/payments/1");
        assert!(
            retry.headers.get("set-cookie").is_none(),
            "Set-Cookie is never replayed"
        );
    }
    let other = new_key();
    let storm = futures::future::join_all((0..50).map(|_| {
        let (gw, other) = (gw.clone(), other.clone());
        async move { post_to(&format!("{gw}/pay"), Some(&other), r#"{"amount":5}"#, &[]).await }
    }))
    .await;
    let bodies: std::collections::BTreeSet<_> = storm
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .map(|a| a.body.clone())
        .collect();
    assert_eq!(bodies.len(), 1, "one answer for all: {bodies:?}");
    for answer in &storm {
        assert!(
            matches!(answer.status.as_u16(), 201 | 409),
            "{}",
            answer.body
        );
    }
    assert_eq!(up.calls(), 2, "one run per key");
    // The same key on another body is a 422, and runs nothing.
    let reused = post_to(&format!("{gw}/pay"), Some(&key), r#"{"amount":11}"#, &[]).await;
    reused.assert_problem(422, "idempotency-key-reused");
    // ... and so is the same key on another path of the route, or another query.
    for path in ["/pay?x=1", "/PAY/"] {
        let other_path = post_to(&format!("{gw}{path}"), Some(&key), r#"{"amount":10}"#, &[]).await;
        other_path.assert_problem(422, "idempotency-key-reused");
    }
    assert_eq!(up.calls(), 2);
}

#[tokio::test]
async fn a_protected_route_needs_a_key_and_other_requests_pass_through_untouched() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(&upstream, &[]).await;
    post_to(&format!("{gw}/pay"), None, "{}", &[])
        .await
        .assert_problem(400, "idempotency-key-missing");
    post_to(&format!("{gw}/pay"), Some(""), "{}", &[])
        .await
        .assert_problem(400, "idempotency-key-invalid");
    assert_eq!(up.calls(), 0);
    // Unprotected: no key needed, every request runs.
    for _ in 0..2 {
        let echoed = post_to(&format!("{gw}/echo"), None, "{}", &[]).await;
        assert_eq!(echoed.body, "echoed");
    }
    assert_eq!(up.calls(), 2);
    // A template's paths: each its own request under one route.
    let key = new_key();
    let a = post_to(&format!("{gw}/orders/7/pay"), Some(&key), "{}", &[]).await;
    assert_eq!(a.status, StatusCode::CREATED);
    post_to(&format!("{gw}/orders/8/pay"), Some(&key), "{}", &[])
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(up.calls(), 3);
}

#[tokio::test]
async fn hop_by_hop_headers_stop_at_the_gateway_and_forwarding_headers_are_added() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(&upstream, &[]).await;
    let answer = post_to(
        &format!("{gw}/echo"),
        None,
        "{}",
        &[
            ("connection", "x-hop, keep-alive"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic c2VjcmV0"),
            ("x-end-to-end", "kept"),
            ("forwarded", "for=6.6.6.6;proto=https;host=evil.example"),
            ("x-real-ip", "6.6.6.6"),
            ("idempotency-key", "chosen-by-the-client"),
        ],
    )
    .await;
    assert!(
        answer.headers.get("x-hop-answer").is_none(),
        "{:?}",
        answer.headers
    );
    let seen = up.last_seen();
    // The forwarded-key header reaches the application from the gateway only.
    for name in [
        "x-hop",
        "keep-alive",
        "te",
        "proxy-authorization",
        "idempotency-key",
    ] {
        assert!(seen.get(name).is_none(), "{name} reached the upstream");
    }
    assert_eq!(seen["x-end-to-end"], "kept");
    assert!(seen.get("forwarded").is_none() && seen.get("x-real-ip").is_none());
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(
        seen["x-forwarded-host"].to_str().unwrap(),
        gw.trim_start_matches("http://")
    );
    assert_eq!(
        seen["host"].to_str().unwrap(),
        upstream.trim_start_matches("http://")
    );
    // On a protected route too: the answer's hop-by-hop header is dropped; a `Connection`
    // cannot name the derived key away; the answer is not encoded (a replay drops
    // Content-Encoding); and each request has a connection of its own (a pooled one the
    // application is closing could fail it after it was sent).
    for _ in 0..3 {
        let paid = post_to(
            &format!("{gw}/pay"),
            Some(&new_key()),
            "{}",
            &[
                ("connection", "idempotency-key"),
                ("accept-encoding", "gzip, br"),
            ],
        )
        .await;
        assert!(paid.headers.get("x-hop-answer").is_none());
        assert!(paid.json()["key"].as_str().is_some(), "{}", paid.body);
        assert!(up.last_seen().get("accept-encoding").is_none());
    }
    let ports: std::collections::BTreeSet<u16> = up.ports.lock().unwrap().iter().copied().collect();
    assert_eq!(ports.len(), 3, "one connection per protected request");
}

#[tokio::test]
async fn an_unprotected_answer_is_streamed_not_buffered() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(&upstream, &[]).await;
    let mut response = oncely_testdb::http()
        .get(format!("{gw}/stream"))
        .send()
        .await
        .unwrap();
    // The first chunk arrives while the upstream still holds the second.
    let first = tokio::time::timeout(Duration::from_secs(10), response.chunk())
        .await
        .expect("the first chunk arrives before the answer ends")
        .unwrap()
        .unwrap();
    assert_eq!(&first[..], b"first\n");
    up.release.notify_one();
    let second = response.chunk().await.unwrap().unwrap();
    assert_eq!(&second[..], b"second\n");
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_and_releases_the_key() {
    // A port nothing listens on, then the upstream on it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let (gw, _db) = start_gateway(&format!("http://{addr}"), &[]).await;
    let key = new_key();
    let refused = post_to(&format!("{gw}/pay"), Some(&key), "{}", &[]).await;
    refused.assert_problem(502, "upstream-unavailable");
    assert!(refused.headers.get("retry-after").is_some());
    let up = Upstream::default();
    let app = Router::new()
        .route("/pay", post(pay))
        .with_state(up.clone());
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let retry = post_to(&format!("{gw}/pay"), Some(&key), "{}", &[]).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert!(!retry.replayed(), "nothing was stored: the retry ran");
    assert_eq!(up.calls(), 1);
}

#[tokio::test]
async fn an_upstream_5xx_is_passed_on_and_releases_the_key() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(&upstream, &[]).await;
    let key = new_key();
    for _ in 0..2 {
        let answer = post_to(&format!("{gw}/fail"), Some(&key), "{}", &[]).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!answer.replayed());
    }
    assert_eq!(up.calls(), 2, "a failure is not stored: each retry runs");
}

/// An upstream on a raw socket that reads each request and then answers `reply` (or nothing)
/// and closes the connection; returns its address and how many requests it read.
async fn raw_upstream(reply: &'static [u8]) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let read = Arc::new(AtomicUsize::new(0));
    let counter = read.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // Up to the end of the head, and the body's bytes (`{}`).
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = socket.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = socket.write_all(reply).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (format!("http://{addr}"), read)
}

#[tokio::test]
async fn an_answer_lost_after_the_request_was_sent_keeps_the_key() {
    for (reply, what) in [
        (&b""[..], "closed without answering"),
        (
            &b"HTTP/1.1 201 Created\r\ncontent-length: 100\r\n\r\n{\"n\":"[..],
            "cut its answer short",
        ),
    ] {
        let (upstream, read) = raw_upstream(reply).await;
        let (gw, _db) = start_gateway(&upstream, &[]).await;
        let key = new_key();
        let lost = post_to(&format!("{gw}/pay"), Some(&key), "{}", &[]).await;
        lost.assert_problem(502, "upstream-outcome-unknown");
        for _ in 0..2 {
            let retry = post_to(&format!("{gw}/pay"), Some(&key), "{}", &[]).await;
            retry.assert_problem(422, "idempotency-key-unreplayable");
            assert!(
                retry.json()["detail"].as_str().unwrap().contains("lost"),
                "{}",
                retry.body
            );
        }
        assert_eq!(
            read.load(Ordering::SeqCst),
            1,
            "upstream {what}: it may have acted, so it is never sent the request again"
        );
    }
}

#[tokio::test]
async fn an_upstream_past_the_timeout_is_504_and_keeps_the_key() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(&upstream, &["--upstream-timeout", "300ms"]).await;
    let key = new_key();
    post_to(&format!("{gw}/slow?ms=3000"), Some(&key), "{}", &[])
        .await
        .assert_problem(504, "upstream-timeout");
    post_to(&format!("{gw}/slow?ms=3000"), Some(&key), "{}", &[])
        .await
        .assert_problem(422, "idempotency-key-unreplayable");
    assert_eq!(up.calls(), 1);
}

/// An upstream slower than the lease: the gateway renews the lease while it waits, so a retry
/// meanwhile gets 409 (never a second run), and the answer, once stored, replays.
#[tokio::test]
async fn an_upstream_slower_than_the_lease_runs_once() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(&upstream, &["--lease", "600ms"]).await;
    let key = new_key();
    let url = format!("{gw}/slow?ms=4000");
    let first = tokio::spawn({
        let (url, key) = (url.clone(), key.clone());
        async move { post_to(&url, Some(&key), "{}", &[]).await }
    });
    // Wait until the upstream has it, then past two leases.
    while up.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let during = post_to(&url, Some(&key), "{}", &[]).await;
    during.assert_problem(409, "idempotency-key-in-use");
    assert!(during.headers.get("retry-after").is_some());
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let after = post_to(&url, Some(&key), "{}", &[]).await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
    assert_eq!(up.calls(), 1);
}

#[tokio::test]
async fn each_credential_is_its_own_tenant() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(&upstream, &["--credential-cookie", "sid"]).await;
    let key = new_key();
    let mut forwarded = std::collections::BTreeSet::new();
    for auth in [
        &[("authorization", "Bearer key-a")][..],
        &[("authorization", "Bearer key-b")][..],
        &[("cookie", "sid=session-c")][..],
        &[][..],
    ] {
        let first = post_to(&format!("{gw}/pay"), Some(&key), "{}", auth).await;
        assert_eq!(first.status, StatusCode::CREATED, "{auth:?}");
        assert!(
            !first.replayed(),
            "{auth:?}: another caller's key never answers"
        );
        forwarded.insert(first.json()["key"].as_str().unwrap().to_owned());
        let again = post_to(&format!("{gw}/pay"), Some(&key), "{}", auth).await;
        assert!(again.replayed(), "{auth:?}");
        assert_eq!(again.body, first.body);
    }
    assert_eq!(up.calls(), 4);
    assert_eq!(forwarded.len(), 4, "each tenant's upstream key differs");
}

#[tokio::test]
async fn a_trusted_tenant_header_scopes_keys() {
    let (upstream, up) = start_upstream().await;
    let (gw, db) = start_gateway(&upstream, &["--tenant-header", "x-tenant-id"]).await;
    let key = new_key();
    for tenant in ["acme", "globex", "acme"] {
        post_to(
            &format!("{gw}/pay"),
            Some(&key),
            "{}",
            &[("x-tenant-id", tenant)],
        )
        .await;
    }
    assert_eq!(up.calls(), 2, "acme's retry replayed; globex ran its own");
    post_to(
        &format!("{gw}/pay"),
        Some(&key),
        "{}",
        &[("x-tenant-id", "no spaces")],
    )
    .await
    .assert_problem(400, "tenant-invalid");
    assert_eq!(up.calls(), 2);
    // Under the gateway's own prefix: never an `oncely serve`'s keys on the same database.
    let tenants: i64 = crate::support::scalar(
        db.url(),
        "SELECT COUNT(DISTINCT tenant) FROM oncely_idempotency_keys WHERE tenant IN ('gateway:tenant:acme', 'gateway:tenant:globex')",
    )
    .await;
    assert_eq!(tenants, 2);
}

/// A trusted header's tenants, the anonymous caller's and each credential's live apart by
/// construction: a header naming `anonymous` or `credential-<hex>` (the hex of another
/// caller's tenant) gets a namespace of its own, never their stored answers; and the
/// credential's hash is in no log line.
#[tokio::test]
async fn header_tenants_never_meet_the_anonymous_or_a_credentials_keys() {
    let (logs, _guard) = crate::support::capture_logs();
    let (upstream, up) = start_upstream().await;
    let (gw, db) = start_gateway(&upstream, &["--tenant-header", "x-tenant-id"]).await;
    let key = new_key();
    let url = format!("{gw}/pay");
    let credential = [("authorization", "Bearer the-victims-key")];
    let victim = post_to(&url, Some(&key), "{}", &credential).await;
    assert_eq!(victim.status, StatusCode::CREATED);
    let anonymous = post_to(&url, Some(&key), "{}", &[]).await;
    assert_eq!(anonymous.status, StatusCode::CREATED);
    assert_eq!(up.calls(), 2);
    let stored: String = crate::support::scalar(
        db.url(),
        "SELECT tenant FROM oncely_idempotency_keys WHERE tenant LIKE 'gateway:credential-%'",
    )
    .await;
    let hex = stored.trim_start_matches("gateway:credential-");
    assert_eq!(hex.len(), 32, "{stored}");
    for named in ["anonymous".to_owned(), format!("credential-{hex}")] {
        let header = [("x-tenant-id", named.as_str())];
        let answer = post_to(&url, Some(&key), "{}", &header).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{named}");
        assert!(
            !answer.replayed(),
            "{named}: another caller's stored answer"
        );
    }
    assert_eq!(up.calls(), 4, "each header tenant ran its own");
    // (The header's own tenant is logged as the header named it.)
    let text = logs
        .text()
        .replace(&format!("gateway:tenant:credential-{hex}"), "header tenant");
    assert!(text.contains("gateway:credential-…"), "{text}");
    let leaks: Vec<&str> = text.lines().filter(|l| l.contains(hex)).collect();
    assert!(
        leaks.is_empty(),
        "the credential's hash is never logged: {leaks:#?}"
    );
}

#[tokio::test]
async fn paths_an_application_could_read_otherwise_are_refused() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(&upstream, &[]).await;
    for path in [
        "/x/../pay",
        "/orders%2F1/pay",
        "/%2e%2e/pay",
        "//pay",
        "/p%61y",
        "/or%64ers/7/pay",
        "/pay;x=1",
    ] {
        // Sent as written (reqwest would normalize dot segments).
        let (status, body) = raw_post(&gw, "POST", path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains("request-ambiguous"), "{path}: {body}");
    }
    let (status, body) = raw_post(&gw, "post", "/pay").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("request-ambiguous"), "{body}");
    assert_eq!(up.calls(), 0);
    // Where no protected method is meant, paths pass as they are.
    let (status, _) = raw_post(&gw, "PUT", "/x/../pay").await;
    assert_eq!(status, 404, "the upstream's own answer");
}

/// `method path` with `{}` and a fresh key, exactly as written; the status and body.
async fn raw_post(base: &str, method: &str, path: &str) -> (u16, String) {
    let mut socket = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nidempotency-key: {}\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}",
        new_key()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    socket.read_to_string(&mut answer).await.unwrap();
    let status = answer[9..12].parse().unwrap();
    (status, answer)
}

#[tokio::test]
async fn the_size_limits_hold_for_requests_and_stored_answers() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(
        &upstream,
        &["--max-request-body", "100", "--max-stored-body", "1000"],
    )
    .await;
    let large = format!("{{\"pad\":\"{}\"}}", "x".repeat(200));
    post_to(&format!("{gw}/pay"), Some(&new_key()), &large, &[])
        .await
        .assert_problem(413, "request-too-large");
    assert_eq!(up.calls(), 0, "an oversized request is not forwarded");
    let key = new_key();
    let first = post_to(&format!("{gw}/big"), Some(&key), "{}", &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.body.len(),
        5000,
        "the first caller gets the whole answer"
    );
    post_to(&format!("{gw}/big"), Some(&key), "{}", &[])
        .await
        .assert_problem(422, "idempotency-key-unreplayable");
    assert_eq!(up.calls(), 1);
}

#[test]
fn the_command_line_refuses_what_it_cannot_do() {
    let plan = |args: &[&str]| {
        let mut argv = vec!["oncely", "gateway"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv) {
            Ok(cli) => match cli.command {
                Command::Gateway(args) => args.plan().err().map(|e| e.to_string()),
                _ => unreachable!(),
            },
            Err(error) => Some(error.to_string()),
        }
    };
    let up = ["--upstream", "http://127.0.0.1:1"];
    for (args, says) in [
        (&up[..], "at least one route"),
        (
            &["--upstream", "https://x:1", "--route", "POST /a"][..],
            "plain HTTP",
        ),
        (
            &["--upstream", "http://u:p@x:1", "--route", "POST /a"][..],
            "no user",
        ),
        (
            &["--upstream", "not a url", "--route", "POST /a"][..],
            "not a URL",
        ),
        (&[up[0], up[1], "--route", "GET /a"][..], "safe method"),
        (
            &[up[0], up[1], "--route", "POST /a", "--route", "POST /A/"][..],
            "twice",
        ),
        (
            &[
                up[0],
                up[1],
                "--route",
                "POST /a",
                "--credential-cookie",
                "a;b",
            ][..],
            "not a cookie name",
        ),
        (
            &[up[0], up[1], "--routes-file", "/nonexistent/routes"][..],
            "--routes-file",
        ),
        (
            &[
                up[0],
                up[1],
                "--route",
                "PUT /orders/{id}",
                "--allow-method-override",
                "PUT /orders/{n}",
            ][..],
            "is a protected route",
        ),
        (
            &[
                up[0],
                up[1],
                "--route",
                "PUT /a",
                "--allow-method-override",
                "GET /a",
            ][..],
            "--allow-method-override",
        ),
    ] {
        let error = plan(args).unwrap_or_else(|| panic!("{args:?} was accepted"));
        assert!(error.contains(says), "{args:?}: {error}");
    }
    assert_eq!(plan(&[up[0], up[1], "--route", "POST /a"]), None);
}

/// docs/gateway.md's table of the gateway's problem types is the code's.
#[test]
fn the_documented_problem_types_are_the_gateways() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/gateway.md"
    ))
    .unwrap();
    let documented: Vec<(String, u16)> = doc
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let slug = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((slug.to_owned(), cells.get(2)?.parse().ok()?))
        })
        .collect();
    let code: Vec<(String, u16)> = oncely_gateway::GatewayProblem::ALL
        .iter()
        .map(|p| (p.slug().to_owned(), p.status().as_u16()))
        .collect();
    assert_eq!(documented, code);
}

/// A secret rotation in its three steps: gateways at step 1 (the new secret accepted) and at
/// step 2 (switched) side by side find each other's keys — a caller's retry replays wherever it
/// lands, never runs again.
#[tokio::test]
async fn gateways_in_a_secret_rotation_replay_each_others_keys() {
    let (upstream, up) = start_upstream().await;
    let db = TestSqlite::new();
    let s = |name: &str| secret(&format!("{name}-0123456789-0123456789-abcdef"));
    let step1 = start_gateway_on(
        db.url(),
        s("old").with_previous(vec![s("new")]),
        &upstream,
        &[],
    )
    .await;
    let step2 = start_gateway_on(
        db.url(),
        s("new").with_previous(vec![s("old")]),
        &upstream,
        &[],
    )
    .await;
    let alice = [("authorization", "Bearer alice")];
    for (first, then) in [(&step2, &step1), (&step1, &step2)] {
        for auth in [&alice[..], &[][..]] {
            let key = new_key();
            let created = post_to(&format!("{first}/pay"), Some(&key), "{}", auth).await;
            assert_eq!(created.status, StatusCode::CREATED);
            let retry = post_to(&format!("{then}/pay"), Some(&key), "{}", auth).await;
            assert!(retry.replayed(), "{auth:?}: {}", retry.body);
            assert_eq!(retry.body, created.body);
        }
    }
    assert_eq!(up.calls(), 4);
}

#[tokio::test]
async fn protected_requests_in_flight_and_their_bodies_are_bounded() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(
        &upstream,
        &[
            "--max-in-flight",
            "1",
            "--max-request-body",
            "100",
            "--body-timeout",
            "300ms",
        ],
    )
    .await;
    // A body declared too large is refused before it is read.
    let (status, body) = raw_request(&gw, "POST /pay", "content-length: 2000000000\r\n", "").await;
    assert_eq!(status, 413, "{body}");
    // A body that does not come in time.
    let (status, body) = raw_request(&gw, "POST /pay", "content-length: 10\r\n", "{}").await;
    assert_eq!(status, 408, "{body}");
    assert!(body.contains("request-body-timeout"), "{body}");
    // One slow request holds the only slot: another is 503 with Retry-After.
    let slow = tokio::spawn({
        let url = format!("{gw}/slow?ms=1500");
        async move { post_to(&url, Some(&new_key()), "{}", &[]).await }
    });
    while up.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let busy = post_to(&format!("{gw}/pay"), Some(&new_key()), "{}", &[]).await;
    busy.assert_problem(503, "gateway-busy");
    assert!(busy.headers.get("retry-after").is_some());
    assert_eq!(slow.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(up.calls(), 1);
    // A client that hangs up does not free the slot while its request still runs.
    give_up(format!("{gw}/slow?ms=2000"), new_key()).await;
    assert_eq!(up.calls(), 2, "the upstream has it");
    post_to(&format!("{gw}/pay"), Some(&new_key()), "{}", &[])
        .await
        .assert_problem(503, "gateway-busy");
    assert_eq!(up.calls(), 2);
}

/// SIGTERM while a protected request whose client hung up still runs: the gateway waits for
/// it and stores its answer, so the retry to the restarted gateway replays it.
#[tokio::test]
async fn a_shutdown_waits_for_protected_requests_whose_clients_hung_up() {
    let (upstream, up) = start_upstream().await;
    let db = TestSqlite::new();
    let args = ["--route", "POST /slow", "--lease", "3s"];
    let gateway = crate::support::spawn_gateway(db.url(), &upstream, &args).await;
    let key = new_key();
    let url = format!("{}/slow?ms=1500", gateway.base);
    give_up(&url, &key).await;
    let mut child = gateway.child;
    let pid = child.id().unwrap().to_string();
    let term = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(term.success());
    let exited = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the gateway exits after its work")
        .unwrap();
    assert!(exited.success(), "{exited:?}");
    let restarted = crate::support::spawn_gateway(db.url(), &upstream, &args).await;
    let retry = post_to(
        &format!("{}/slow?ms=1500", restarted.base),
        Some(&key),
        "{}",
        &[],
    )
    .await;
    assert!(retry.replayed(), "{}", retry.body);
    assert_eq!(up.calls(), 1, "the upstream ran once");
}

/// `request` (`METHOD /path`) with a fresh key, `headers` (each ending in CRLF) and `body`
/// written as they are, then the connection half-closed for writing only after 2 s; the
/// status and the answer.
async fn raw_request(base: &str, request: &str, headers: &str, body: &str) -> (u16, String) {
    let mut socket = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "{request} HTTP/1.1\r\nhost: x\r\nidempotency-key: {}\r\ncontent-type: application/json\r\n{headers}connection: close\r\n\r\n{body}",
        new_key()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_string(&mut answer))
        .await
        .expect("the gateway answers without waiting for the rest of the body")
        .unwrap();
    (answer[9..12].parse().unwrap(), answer)
}

#[test]
fn headers_the_gateway_needs_cannot_be_its_key_or_tenant_header() {
    let plan = |args: &[&str]| {
        let mut argv = vec![
            "oncely",
            "gateway",
            "--upstream",
            "http://127.0.0.1:1",
            "--route",
            "POST /a",
        ];
        argv.extend_from_slice(args);
        let Command::Gateway(args) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        args.plan().err().map(|e| e.to_string())
    };
    for (args, says) in [
        (
            &["--forward-key-header", "authorization"][..],
            "--forward-key-header",
        ),
        (
            &["--forward-key-header", "connection"][..],
            "--forward-key-header",
        ),
        (
            &["--forward-key-header", "host"][..],
            "--forward-key-header",
        ),
        (&["--tenant-header", "authorization"][..], "--tenant-header"),
        (&["--tenant-header", "cookie"][..], "--tenant-header"),
        (&["--lease", "1ms"][..], "--lease"),
        (&["--max-in-flight", "0"][..], "--max-in-flight"),
    ] {
        let error = plan(args).unwrap_or_else(|| panic!("{args:?} was accepted"));
        assert!(error.contains(says), "{args:?}: {error}");
    }
    assert_eq!(plan(&["--forward-key-header", "x-request-key"]), None);
}

/// The binary's server closes a connection whose request head does not arrive in time (slow
/// headers held sockets for ever), and still serves whole requests, with the peer's address.
#[tokio::test]
async fn a_client_that_sends_its_headers_too_slowly_is_disconnected() {
    let (upstream, up) = start_upstream().await;
    let db = TestSqlite::new();
    let gateway = crate::support::spawn_gateway(
        db.url(),
        &upstream,
        &["--route", "POST /pay", "--header-timeout", "300ms"],
    )
    .await;
    let mut socket = tokio::net::TcpStream::connect(gateway.base.trim_start_matches("http://"))
        .await
        .unwrap();
    socket
        .write_all(b"POST /pay HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), socket.read_to_end(&mut answer))
        .await
        .expect("the gateway closes the connection")
        .ok();
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let paid = post_to(
        &format!("{}/pay", gateway.base),
        Some(&new_key()),
        "{}",
        &[],
    )
    .await;
    assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    assert_eq!(up.last_seen()["x-forwarded-for"], "127.0.0.1");
}

/// Headers of a request, as name and value.
type Headers<'a> = &'a [(&'a str, &'a str)];

/// A request that names another method — in an override header (any value, comma-separated or
/// repeated) or a `_method` parameter (query or body, names and values percent-decoded) — is
/// that method to Rails, Laravel, Spring or Express' method-override: refused on every route,
/// never passed through unprotected.
#[tokio::test]
async fn a_method_override_is_refused_however_it_is_spelled() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(&upstream, &["--route", "PATCH /echo"]).await;
    let form = ("content-type", "application/x-www-form-urlencoded");
    let cases: &[(&str, Headers, &str)] = &[
        ("/echo", &[("x-http-method-override", "PATCH")], "{}"),
        ("/echo", &[("x-http-method", "patch")], "{}"),
        ("/echo", &[("x-method-override", "POST")], "{}"),
        ("/echo", &[("x-http-method-override", "PATCH, GET")], "{}"),
        ("/echo", &[("x-http-method-override", "GET, PATCH")], "{}"),
        (
            "/echo",
            &[
                ("x-http-method-override", "GET"),
                ("x-http-method", "PATCH"),
            ],
            "{}",
        ),
        ("/echo", &[("x-http-method-override", "DELETE")], "{}"),
        ("/echo", &[("x-http-method-override", "")], "{}"),
        ("/echo?_method=PATCH", &[], "{}"),
        ("/echo?%5Fmethod=PATCH", &[], "{}"),
        ("/echo?_method=P%41TCH", &[], "{}"),
        ("/echo?_method=DELETE", &[], "{}"),
        ("/elsewhere?_method=PATCH", &[], "{}"),
        ("/echo", &[form], "_method=PATCH"),
        ("/echo", &[form], "a=1&%5Fmethod=P%41TCH"),
        ("/echo", &[], r#"{"_method":"PATCH"}"#),
    ];
    for (path, headers, body) in cases {
        let answer = post_to(&format!("{gw}{path}"), None, body, headers).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{path} {headers:?} {body}"
        );
        answer.assert_problem(400, "request-ambiguous");
    }
    assert_eq!(up.calls(), 0, "nothing reached the application");
    // A form without `_method`, and a field whose value (not name) is `_method`, pass.
    let echoed = post_to(&format!("{gw}/echo"), None, "note=_method", &[form]).await;
    assert_eq!(echoed.body, "echoed");
    assert_eq!(up.calls(), 1);
}

/// `--allow-method-override` lets overrides through on the routes an operator names — but
/// never one that names a method protected at the path.
#[tokio::test]
async fn an_operator_allows_overrides_on_a_route_but_never_to_a_protected_method() {
    let (upstream, up) = start_upstream().await;
    let (gw, _db) = start_gateway(
        &upstream,
        &[
            "--route",
            "PATCH /echo",
            "--allow-method-override",
            "POST /echo",
        ],
    )
    .await;
    let echoed = post_to(
        &format!("{gw}/echo?_method=DELETE"),
        None,
        "{}",
        &[("x-forwarded-host", "evil.example")],
    )
    .await;
    assert_eq!(echoed.body, "echoed");
    assert_ne!(up.last_seen()["x-forwarded-host"], "evil.example");
    for (path, headers) in [
        ("/echo?_method=P%41TCH", &[][..]),
        ("/echo", &[("x-http-method-override", "DELETE, patch")][..]),
    ] {
        post_to(&format!("{gw}{path}"), None, "{}", headers)
            .await
            .assert_problem(400, "request-ambiguous");
    }
    assert_eq!(up.calls(), 1);
    // Only on that route: a PUT elsewhere with an override is refused.
    post_to(
        &format!("{gw}/other"),
        None,
        "{}",
        &[("x-http-method-override", "DELETE")],
    )
    .await
    .assert_problem(400, "request-ambiguous");
}

/// A POST of `{}` with `key` whose client gives up after 300 ms (before the answer).
async fn give_up(url: impl reqwest::IntoUrl, key: impl AsRef<str>) {
    let gave_up = oncely_testdb::http()
        .post(url)
        .header("idempotency-key", key.as_ref())
        .header("content-type", "application/json")
        .body("{}")
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(gave_up.is_err(), "the client gave up before the answer");
}

/// `oncely gateway` through PgBouncer in transaction mode (its keys' store on the pooler, its
/// start-up's migrations over the direct URL): retries and concurrent duplicates still reach
/// the upstream once per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gateway_runs_through_pgbouncer_in_transaction_mode() {
    let Some((_url, _db, bouncer)) = crate::pooler::migrated_behind_a_bouncer().await else {
        return;
    };
    let (upstream, up) = start_upstream().await;
    let sess = bouncer.url("sess");
    let args = [
        "--route",
        "POST /pay",
        "--database-pooler",
        "transaction",
        "--database-direct-url",
        sess.as_str(),
    ];
    let gateway = crate::support::spawn_gateway(&bouncer.url("tx"), &upstream, &args).await;
    let pay = format!("{}/pay", gateway.base);
    let key = new_key();
    let first = post_to(&pay, Some(&key), r#"{"amount":10}"#, &[]).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    for _ in 0..10 {
        let retry = post_to(&pay, Some(&key), r#"{"amount":10}"#, &[]).await;
        assert!(retry.replayed(), "{}", retry.body);
        assert_eq!(retry.body, first.body);
    }
    let other = new_key();
    let storm = futures::future::join_all(
        (0..30).map(|_| post_to(&pay, Some(&other), r#"{"amount":5}"#, &[])),
    )
    .await;
    for answer in &storm {
        assert!(
            matches!(answer.status.as_u16(), 201 | 409),
            "{}",
            answer.body
        );
    }
    assert_eq!(up.calls(), 2, "one run per key");
}
