//! The client against a scripted server: what it retries, what it never retries, and that every
//! attempt carries the same key and body.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use oncely_client::{Client, Error, Operation, RetryPolicy};
use serde_json::json;

/// A status and extra headers.
type Scripted = (u16, Vec<(&'static str, &'static str)>);

/// What the server answers, in order; and every attempt it saw: (key, body, when).
#[derive(Default)]
struct Script {
    answers: Mutex<VecDeque<Scripted>>,
    seen: Mutex<Vec<(String, Bytes, Instant)>>,
}

async fn scripted(State(script): State<Arc<Script>>, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    script
        .seen
        .lock()
        .unwrap()
        .push((key, body, Instant::now()));
    let (status, extra) = script
        .answers
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or((500, vec![]));
    let mut response = (StatusCode::from_u16(status).unwrap(), "{\"ok\":true}").into_response();
    for (name, value) in extra {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

async fn serve(
    answers: Vec<(u16, Vec<(&'static str, &'static str)>)>,
) -> (reqwest::Url, Arc<Script>) {
    let script = Arc::new(Script::default());
    *script.answers.lock().unwrap() = answers.into();
    let app = Router::new()
        .route("/op", post(scripted))
        .with_state(script.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}").parse().unwrap(), script)
}

fn quick() -> RetryPolicy {
    RetryPolicy {
        initial_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        ..RetryPolicy::DEFAULT
    }
}

fn client(base: reqwest::Url) -> Client {
    Client::new(base)
        .http_client(oncely_testdb::http())
        .policy(quick())
}

#[tokio::test]
async fn retries_keep_the_key_and_body_honour_retry_after_and_report_a_replay() {
    let (base, script) = serve(vec![
        (503, vec![]),
        (409, vec![("retry-after", "1")]),
        (202, vec![("idempotent-replayed", "true")]),
    ])
    .await;
    let op = Operation::post("/op")
        .json(&json!({"email": "a@example.com"}))
        .unwrap();
    let answer = client(base).send(&op).await.unwrap();
    assert_eq!(answer.status, 202);
    assert!(answer.replayed);
    assert_eq!(answer.attempts, 3);
    let seen = script.seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for (key, body, _) in seen.iter() {
        assert_eq!(key, op.key(), "one key for every attempt");
        assert_eq!(body, &seen[0].1, "the same body for every attempt");
    }
    assert!(
        seen[2].2 - seen[1].2 >= Duration::from_secs(1),
        "the 409's Retry-After was honoured"
    );
}

#[tokio::test]
async fn a_422_or_another_4xx_is_final_and_never_retried() {
    for status in [422, 400, 404, 413, 415] {
        let (base, script) = serve(vec![(status, vec![]), (202, vec![])]).await;
        let answer = client(base).send(&Operation::post("/op")).await.unwrap();
        assert_eq!(answer.status.as_u16(), status);
        assert!(!answer.replayed && !answer.is_success());
        assert_eq!(answer.attempts, 1);
        assert_eq!(script.seen.lock().unwrap().len(), 1, "{status} was retried");
    }
}

#[tokio::test]
async fn a_refused_connection_is_retried_on_the_next_endpoint_with_the_same_key() {
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        format!("http://{addr}").parse().unwrap()
    };
    let (live, script) = serve(vec![(201, vec![])]).await;
    let client = Client::with_endpoints(vec![dead, live])
        .http_client(oncely_testdb::http())
        .policy(quick());
    let op = Operation::post("/op").with_key("stored-key-1");
    let answer = client.send(&op).await.unwrap();
    assert_eq!((answer.status.as_u16(), answer.attempts), (201, 2));
    assert_eq!(script.seen.lock().unwrap()[0].0, "stored-key-1");
}

#[tokio::test]
async fn it_gives_up_after_its_attempts_and_says_the_outcome_is_unknown() {
    let (base, script) = serve(vec![]).await; // 500 for ever
    let client = client(base).policy(RetryPolicy {
        max_attempts: 4,
        ..quick()
    });
    let op = Operation::post("/op");
    match client.send(&op).await {
        Err(Error::GaveUp {
            attempts,
            key,
            last,
            status,
        }) => {
            assert_eq!(attempts, 4);
            assert_eq!(status, Some(StatusCode::INTERNAL_SERVER_ERROR));
            assert_eq!(key, op.key());
            assert!(last.contains("500"), "{last}");
        }
        other => panic!("expected GaveUp, got {other:?}"),
    }
    assert_eq!(script.seen.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn separate_operations_get_separate_keys() {
    let a = Operation::post("/op");
    let b = Operation::post("/op");
    assert_ne!(a.key(), b.key());
    assert_eq!(a.clone().key(), a.key(), "a clone is the same operation");
}
