//! Hostile input: every malformed request gets a clear 4xx (problem+json where the API answers),
//! never a 5xx and never a hang; and nothing of it is stored.

use std::time::Duration;

use oncely_testdb::TestSqlite;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{TestApp, spawn_app_on};

const SIGNUP: &str = "/v1/signup";

async fn app() -> (TestApp, TestSqlite) {
    let db = TestSqlite::new();
    (spawn_app_on(db.url(), |_| {}).await, db)
}

/// Sends raw bytes and reads the answer's status line (bounded: a hang fails the test).
async fn raw(app: &TestApp, request: &[u8]) -> u16 {
    let addr = app.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).await.unwrap_or(0);
            answer.extend_from_slice(&buf[..n]);
            if n == 0 || answer.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the server hung on {:?}",
        String::from_utf8_lossy(&request[..request.len().min(80)])
    );
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"))
}

async fn problem(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap()),
        Some("application/problem+json"),
        "status {status}"
    );
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn oversized_bodies_and_headers_are_refused_with_4xx() {
    let (app, _db) = app().await;
    let huge = format!("{{\"email\":\"{}@example.com\"}}", "a".repeat(64 * 1024));
    let response = app
        .client
        .post(format!("{}{SIGNUP}", app.base))
        .header("idempotency-key", "big-body")
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    let (status, body) = problem(response).await;
    assert_eq!(status, 413, "{body}");

    let header = format!(
        "POST {SIGNUP} HTTP/1.1\r\nhost: x\r\nidempotency-key: k\r\nx-filler: {}\r\ncontent-length: 2\r\n\r\n{{}}",
        "b".repeat(512 * 1024)
    );
    let status = raw(&app, header.as_bytes()).await;
    assert!((400..500).contains(&status), "a 512 KiB header: {status}");

    let many: String = (0..500).map(|i| format!("x-h{i}: v\r\n")).collect();
    let request =
        format!("POST {SIGNUP} HTTP/1.1\r\nhost: x\r\n{many}content-length: 2\r\n\r\n{{}}");
    let status = raw(&app, request.as_bytes()).await;
    assert!((400..500).contains(&status), "500 headers: {status}");

    let key = "k".repeat(256);
    let response = app
        .client
        .post(format!("{}{SIGNUP}", app.base))
        .header("idempotency-key", key)
        .json(&serde_json::json!({"email": "a@example.com"}))
        .send()
        .await
        .unwrap();
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["type"].as_str().unwrap()),
        (400, "https://oncely.dev/problems/idempotency-key-invalid")
    );
}

#[tokio::test]
async fn wrong_content_types_invalid_utf8_and_broken_json_are_4xx() {
    let (app, _db) = app().await;
    let send = |content_type: Option<&'static str>, body: Vec<u8>, key: &'static str| {
        let mut request = app
            .client
            .post(format!("{}{SIGNUP}", app.base))
            .header("idempotency-key", key)
            .body(body);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        request.send()
    };
    let cases: Vec<(Option<&'static str>, Vec<u8>, u16, &str)> = vec![
        (
            None,
            br#"{"email":"a@example.com"}"#.to_vec(),
            415,
            "no content type",
        ),
        (
            Some("text/plain"),
            br#"{"email":"a@example.com"}"#.to_vec(),
            415,
            "text/plain",
        ),
        (
            Some("application/x-www-form-urlencoded"),
            b"email=a%40example.com".to_vec(),
            415,
            "a form",
        ),
        (
            Some("application/json"),
            b"{\"email\":\"a\xff\xfe@example.com\"}".to_vec(),
            400,
            "invalid UTF-8",
        ),
        (
            Some("application/json"),
            b"{\"email\":".to_vec(),
            400,
            "truncated JSON",
        ),
        (Some("application/json"), b"".to_vec(), 400, "empty body"),
        (
            Some("application/json"),
            b"[1,2,3]".to_vec(),
            400,
            "an array",
        ),
        (
            Some("application/json"),
            br#"{"email":42}"#.to_vec(),
            400,
            "a number for the address",
        ),
        (
            Some("application/json"),
            br#"{"email":"a@example.com","email":"b@example.com"}"#.to_vec(),
            400,
            "a repeated field",
        ),
        (
            Some("application/json"),
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
            400,
            "100,000 nested arrays",
        ),
        (
            Some("application/json"),
            format!(
                "{{\"email\":\"a@example.com\",\"source\":{}1{}}}",
                "{\"a\":".repeat(5_000),
                "}".repeat(5_000)
            )
            .into_bytes(),
            400,
            "5,000 nested objects",
        ),
    ];
    for (i, (content_type, body, expected, what)) in cases.into_iter().enumerate() {
        let key: &'static str = Box::leak(format!("hostile-{i}").into_boxed_str());
        let response = send(content_type, body, key).await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert!(
            status == expected || (what.contains("nested") && status == 413),
            "{what}: expected {expected}, got {status}: {text}"
        );
    }
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_users").await,
        0,
        "nothing was stored"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_idempotency_keys")
            .await,
        0,
        "a refused request leaves its key free"
    );
}

#[tokio::test]
async fn invalid_header_bytes_and_broken_framing_never_get_a_5xx() {
    let (app, _db) = app().await;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "a non-UTF-8 key",
            b"POST /v1/signup HTTP/1.1\r\nhost: x\r\nidempotency-key: \xff\xfe\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}".to_vec(),
        ),
        (
            "a non-UTF-8 bearer token",
            b"POST /v1/signup HTTP/1.1\r\nhost: x\r\nauthorization: Bearer \xff\r\nidempotency-key: k\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}".to_vec(),
        ),
        (
            "two keys",
            b"POST /v1/signup HTTP/1.1\r\nhost: x\r\nidempotency-key: a\r\nidempotency-key: b\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}".to_vec(),
        ),
        (
            "a content length that is not a number",
            b"POST /v1/signup HTTP/1.1\r\nhost: x\r\nidempotency-key: k\r\ncontent-length: lots\r\n\r\n{}".to_vec(),
        ),
        (
            "a body shorter than its content length",
            b"POST /v1/signup HTTP/1.1\r\nhost: x\r\nidempotency-key: k2\r\ncontent-type: application/json\r\ncontent-length: 100\r\nconnection: close\r\n\r\n{}".to_vec(),
        ),
        (
            "a broken chunked body",
            b"POST /v1/signup HTTP/1.1\r\nhost: x\r\nidempotency-key: k3\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n".to_vec(),
        ),
        (
            "a path with invalid percent-encoding",
            b"GET /v1/verify?token=%ff%fe HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
        ),
    ];
    for (what, request) in cases {
        if what == "a body shorter than its content length" {
            // The client stops sending but keeps the connection open: the server must not
            // answer 5xx; it may wait for the rest, so only check that it does not crash.
            let addr = app.base.trim_start_matches("http://");
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(&request).await.unwrap();
            drop(stream);
            continue;
        }
        let status = raw(&app, &request).await;
        if what.starts_with("a path") {
            // The verify page renders for any token (it consumes nothing); only a 5xx is wrong.
            assert!(status < 500, "{what}: {status}");
        } else {
            assert!((400..500).contains(&status), "{what}: {status}");
        }
    }
    let health = app.get("/healthz").await;
    assert_eq!(health.status(), 200, "the server is still up");
}
