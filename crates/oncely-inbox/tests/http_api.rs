//! The inbox's HTTP API as a client (a test, an operator, the chaos run) uses it.

use std::time::{Duration, Instant};

use oncely_inbox::{Faults, Inbox};
use serde_json::{Value, json};

async fn start() -> (Inbox, String) {
    let (inbox, running) = Inbox::start_local(Faults::default()).await.unwrap();
    (inbox, format!("http://{}", running.http_addr))
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
    let to_x: Vec<Value> = http
        .get(format!("{base}/messages?to=X@example.com"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(to_x.len(), 2, "every copy is kept");
    let id = to_x[0]["id"].as_str().unwrap();
    let one: Value = http
        .get(format!("{base}/messages/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(one["idempotency_key"], "k1");
    assert_eq!(
        http.get(format!("{base}/messages/nope"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    let stats: Value = http
        .get(format!("{base}/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (stats["delivered"].as_u64(), stats["duplicates"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(
        http.delete(format!("{base}/messages"))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    let all: Vec<Value> = http
        .get(format!("{base}/messages"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    let rejected = http
        .post(format!("{base}/emails"))
        .json(&email("z@example.com"))
        .send()
        .await
        .unwrap();
    assert_eq!(rejected.status(), 503, "a temporary rejection");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "the delay is applied"
    );
    let accepted = http
        .post(format!("{base}/emails"))
        .json(&email("z@example.com"))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 200);
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
