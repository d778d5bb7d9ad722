//! Issue 21, item 4: slow and hostile clients hold only their own connection, and only for a
//! while. A slowloris client (headers trickled), a client that connects and says nothing, one
//! that trickles its body, one that stops reading its responses, and ten thousand idle
//! connections: the service answers everyone else meanwhile, and each of them is cut off by its
//! bound (`ONCELY_HEADER_READ_TIMEOUT`, `ONCELY_BODY_READ_TIMEOUT`, `ONCELY_WRITE_TIMEOUT`,
//! `ONCELY_MAX_CONNECTIONS`).
//!
//! The bounds are set short here (a second or two); each assertion waits for an effect with a
//! generous limit (tens of seconds), never for a speed.

use std::time::{Duration, Instant};

use oncely_testdb::TestSqlite;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{TestApp, spawn_app_on, spawn_binary};

/// Long enough for any effect on a loaded CI machine; never a speed target.
const PATIENCE: Duration = Duration::from_secs(30);

/// Within this a connection past a bound of a second or three is closed: half of hyper's own
/// 30 s header timeout, so that the bounds set here, not a default, are what close it.
const CUT_OFF: Duration = Duration::from_secs(15);

async fn app() -> (TestApp, TestSqlite) {
    let db = TestSqlite::new();
    let app = spawn_app_on(db.url(), |s| {
        s.connections.header_read_timeout = Duration::from_secs(1);
        s.connections.body_read_timeout = Duration::from_secs(2);
        s.connections.write_timeout = Duration::from_secs(1);
    })
    .await;
    (app, db)
}

fn addr(base: &str) -> String {
    base.trim_start_matches("http://").to_owned()
}

/// Whether the server answers a plain request now.
async fn answers(base: &str) -> bool {
    // Installs the TLS provider reqwest needs (another test of the process may not have: under
    // cargo-nextest each test is a process of its own).
    let _ = oncely_testdb::http();
    let client = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    client
        .get(format!("{base}/healthz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

/// Reads until the server closes the connection (EOF or reset); the bytes read, or `None` if
/// it was still open after [`CUT_OFF`].
async fn until_closed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut all = Vec::new();
    let closed = tokio::time::timeout(CUT_OFF, async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    closed.is_ok().then_some(all)
}

#[tokio::test]
async fn a_slowloris_client_and_a_silent_one_are_closed_and_others_are_answered_meanwhile() {
    let (app, _db) = app().await;
    let mut silent = TcpStream::connect(addr(&app.base)).await.unwrap();
    let mut slow = TcpStream::connect(addr(&app.base)).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // A header byte every 200 ms, for ever (until the server closes).
    let trickle = tokio::spawn(async move {
        let started = Instant::now();
        loop {
            if slow.write_all(b"X").await.is_err() || started.elapsed() > CUT_OFF {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            if slow.peek(&mut [0u8; 1]).await.is_ok_and(|n| n == 0) {
                break;
            }
        }
        // How long the server let it go on.
        started.elapsed()
    });
    assert!(answers(&app.base).await, "answered while both hang on");
    assert!(
        until_closed(&mut silent).await.is_some(),
        "a connection that sends nothing is closed (header read timeout)"
    );
    let trickled_for = trickle.await.unwrap();
    assert!(
        trickled_for < CUT_OFF,
        "the slowloris client was not cut off by its 1 s header timeout"
    );
    assert!(answers(&app.base).await);
}

#[tokio::test]
async fn a_body_trickled_past_its_deadline_is_answered_408_and_stores_nothing() {
    let (app, _db) = app().await;
    let body = br#"{"email": "slow@example.com", "password": "correct horse battery"}"#;
    let mut stream = TcpStream::connect(addr(&app.base)).await.unwrap();
    let head = format!(
        "POST /v1/signup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Idempotency-Key: slow-1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // Two bytes every 300 ms: 10 s for the body, against a 2 s deadline.
    let answered = tokio::time::timeout(PATIENCE, async {
        let mut answer = Vec::new();
        for chunk in body.chunks(2) {
            let _ = stream.write_all(chunk).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut buf = [0u8; 4096];
            if let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(1), stream.read(&mut buf)).await
            {
                answer.extend_from_slice(&buf[..n]);
                if n == 0 || answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
        }
        let mut buf = vec![0u8; 4096];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf))
            .await
            .map(|read| read.map(|n| answer.extend_from_slice(&buf[..n])));
        answer
    })
    .await
    .expect("the trickled request was never answered");
    let answer = String::from_utf8_lossy(&answered);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request-body-timeout"), "{answer}");
    let users: i64 = app.count("SELECT count(*) FROM oncely_users").await;
    assert_eq!(users, 0, "nothing ran");
    // The same request sent at once runs.
    let response = app
        .client
        .post(format!("{}/v1/signup", app.base))
        .header("Idempotency-Key", "slow-2")
        .json(&serde_json::from_slice::<Value>(body).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
}

#[tokio::test]
async fn a_client_that_stops_reading_its_responses_is_closed_and_others_are_answered() {
    let (app, _db) = app().await;
    let one = app
        .client
        .get(format!("{}/openapi.json", app.base))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .len();
    // Enough pipelined requests that their answers overflow every buffer on the way (tens of
    // MiB), sent and never read.
    let requests = (64 * 1024 * 1024 / one).max(1);
    let mut stream = TcpStream::connect(addr(&app.base)).await.unwrap();
    let pipelined = "GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n".repeat(requests);
    let (mut reader, mut writer) = stream.split();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        writer.write_all(pipelined.as_bytes()),
    )
    .await;
    // While it reads nothing, the server answers others, and after its write timeout gives up
    // on this one.
    assert!(answers(&app.base).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(answers(&app.base).await);
    let mut read = 0usize;
    let closed = tokio::time::timeout(PATIENCE, async {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection stayed open");
    assert!(
        read < requests * one,
        "every answer was delivered ({read} bytes): the server never gave up on the client"
    );
}

#[tokio::test]
async fn ten_thousand_idle_connections_do_not_stop_the_service_and_are_closed() {
    // Another process, so that the server's sockets and the test's are not counted together
    // against one open-file limit.
    let db = TestSqlite::new();
    let server = spawn_binary(
        db.url(),
        "dev",
        &["--header-read-timeout", "3s", "--workers", "0"],
        &[("RUST_LOG", "warn")],
    )
    .await;
    let target = addr(&server.base);
    let mut idle = Vec::with_capacity(10_000);
    for _ in 0..10_000 {
        match TcpStream::connect(&target).await {
            Ok(stream) => idle.push(stream),
            Err(error) => panic!("connection {} refused: {error}", idle.len() + 1),
        }
    }
    // The 10,001st client is answered while they all hang on.
    assert!(
        answers(&server.base).await,
        "not answered beside 10,000 idle connections"
    );
    // And they are closed by the header read timeout: each one reads EOF.
    let mut closed = 0;
    for stream in idle.iter_mut().step_by(100) {
        closed += usize::from(until_closed(stream).await.is_some());
    }
    assert_eq!(closed, 100, "idle connections were left open");
    drop(idle);
    assert!(answers(&server.base).await);
}
