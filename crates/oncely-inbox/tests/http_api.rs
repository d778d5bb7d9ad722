//! The inbox's HTTP API as a client (a test, an operator, the chaos run) uses it.

use std::time::{Duration, Instant};

use oncely_inbox::{Faults, Inbox};
use serde_json::{Value, json};

async fn start() -> (Inbox, String) {
    let (inbox, running) = Inbox::start_local(Faults::default()).await.unwrap();
    (inbox, format!("http://{}", running.http_addr))
}

/// The JSON answer to a GET.
async fn get_json<T: serde::de::DeserializeOwned>(url: String) -> T {
    let response = oncely_testdb::http().get(url).send().await.unwrap();
    response.json().await.unwrap()
}

/// The status of a sent request.
async fn status_of(request: reqwest::RequestBuilder) -> u16 {
    request.send().await.unwrap().status().as_u16()
}

fn email(to: &str) -> Value {
    json!({ "from": "a@example.com", "to": [to], "subject": "Hi", "text": "hello" })
}

#[tokio::test]
async fn messages_are_listed_filtered_fetched_counted_and_cleared() {
    let (_inbox, base) = start().await;
    let http = oncely_testdb::http();
    for (to, key) in [
        ("x@example.com", "k1"),
        ("y@example.com", "k2"),
        ("x@example.com", "k1"),
    ] {
        let r = http
            .post(format!("{base}/emails"))
            .header("idempotency-key", key)
            .json(&email(to))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let to_x: Vec<Value> = get_json(format!("{base}/messages?to=X@example.com")).await;
    assert_eq!(to_x.len(), 2, "every copy is kept");
    let id = to_x[0]["id"].as_str().unwrap();
    let one: Value = get_json(format!("{base}/messages/{id}")).await;
    assert_eq!(one["idempotency_key"], "k1");
    assert_eq!(
        status_of(http.get(format!("{base}/messages/nope"))).await,
        404
    );
    let stats: Value = get_json(format!("{base}/stats")).await;
    assert_eq!(
        (stats["delivered"].as_u64(), stats["duplicates"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(
        status_of(http.delete(format!("{base}/messages"))).await,
        204
    );
    let all: Vec<Value> = get_json(format!("{base}/messages")).await;
    assert!(all.is_empty());
}

#[tokio::test]
async fn faults_are_set_over_http_and_delay_and_reject_as_configured() {
    let (_inbox, base) = start().await;
    let http = oncely_testdb::http();
    let faults = Faults {
        reject_next: 1,
        delay_ms: 200,
        ..Faults::default()
    };
    let set: Faults = http
        .put(format!("{base}/faults"))
        .json(&faults)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(set, faults);
    let started = Instant::now();
    let send = || {
        http.post(format!("{base}/emails"))
            .json(&email("z@example.com"))
    };
    assert_eq!(status_of(send()).await, 503, "a temporary rejection");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "the delay is applied"
    );
    assert_eq!(status_of(send()).await, 200);
}

#[tokio::test]
async fn provider_mode_over_http_answers_a_repeat_with_the_first_id() {
    let (inbox, base) = start().await;
    inbox.set_faults(Faults::provider());
    let http = oncely_testdb::http();
    let send = || {
        http.post(format!("{base}/emails"))
            .header("idempotency-key", "same")
            .json(&email("p@example.com"))
            .send()
    };
    let first: Value = send().await.unwrap().json().await.unwrap();
    let second: Value = send().await.unwrap().json().await.unwrap();
    assert_eq!(first["id"], second["id"]);
    assert_eq!(inbox.messages(None).len(), 1);
}
