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

/// Posts `body` to `/emails` with `Idempotency-Key: key`; the status and the JSON answer.
async fn post_email(base: &str, key: &str, body: &Value) -> (u16, Option<String>, Value) {
    let response = oncely_testdb::http()
        .post(format!("{base}/emails"))
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (
        status,
        retry_after,
        response.json().await.unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn provider_mode_answers_409_like_resend_for_another_payload_and_for_a_key_in_flight() {
    let (inbox, base) = start().await;
    inbox.set_faults(Faults::provider());
    let (status, _, _) = post_email(&base, "k", &email("p@example.com")).await;
    assert_eq!(status, 200);
    let (status, _, body) = post_email(&base, "k", &email("q@example.com")).await;
    assert_eq!(status, 409, "the same key with another recipient");
    assert_eq!(body["name"], "invalid_idempotent_request");

    inbox.set_faults(Faults {
        delay_ms: 500,
        ..Faults::provider()
    });
    // Two requests at once: whichever comes second finds the key in flight (the first holds it
    // through its delay) and hears 409.
    let slow = email("s@example.com");
    let (a, b) = tokio::join!(
        post_email(&base, "slow", &slow),
        post_email(&base, "slow", &slow)
    );
    let (done, concurrent) = if a.0 == 200 { (a, b) } else { (b, a) };
    assert_eq!(done.0, 200);
    assert_eq!(concurrent.0, 409);
    assert_eq!(concurrent.2["name"], "concurrent_idempotent_requests");
    assert_eq!(inbox.messages(Some("s@example.com")).len(), 1);
    let stats: Value = get_json(format!("{base}/stats")).await;
    assert_eq!(
        (stats["mismatched"].as_u64(), stats["concurrent"].as_u64()),
        (Some(1), Some(1))
    );
}

#[tokio::test]
async fn throttling_and_refused_credentials_are_set_over_http_and_counted() {
    let (_inbox, base) = start().await;
    let http = oncely_testdb::http();
    let faults = json!({ "throttle_next": 1, "retry_after_s": 120, "unauthorized_next": 1 });
    let set: Value = http
        .put(format!("{base}/faults"))
        .json(&faults)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (set["throttle_next"].as_u64(), set["reject_next"].as_u64()),
        (Some(1), Some(0))
    );
    let (status, _, body) = post_email(&base, "a", &email("t@example.com")).await;
    assert_eq!(
        (status, body["name"].as_str()),
        (401, Some("invalid_api_key"))
    );
    let (status, retry_after, body) = post_email(&base, "a", &email("t@example.com")).await;
    assert_eq!(
        (status, body["name"].as_str()),
        (429, Some("rate_limit_exceeded"))
    );
    assert_eq!(retry_after.as_deref(), Some("120"));
    assert_eq!(post_email(&base, "a", &email("t@example.com")).await.0, 200);
    let stats: Value = get_json(format!("{base}/stats")).await;
    assert_eq!(
        (
            stats["unauthorized"].as_u64(),
            stats["throttled"].as_u64(),
            stats["delivered"].as_u64()
        ),
        (Some(1), Some(1), Some(1))
    );
}

#[tokio::test]
async fn delete_takes_every_message_or_the_ids_given_like_mailpit_or_one_by_its_path() {
    let (_inbox, base) = start().await;
    let http = oncely_testdb::http();
    for n in 0..4 {
        post_email(
            &base,
            &format!("k{n}"),
            &email(&format!("u{n}@example.com")),
        )
        .await;
    }
    let all: Vec<Value> = get_json(format!("{base}/messages")).await;
    let ids: Vec<&str> = all.iter().map(|m| m["id"].as_str().unwrap()).collect();
    let delete_ids = http
        .delete(format!("{base}/messages"))
        .json(&json!({ "IDs": [ids[0], ids[1], "no-such-id"] }));
    assert_eq!(status_of(delete_ids).await, 204);
    let left: Vec<Value> = get_json(format!("{base}/messages")).await;
    assert_eq!(
        left.iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ids[2..]
    );
    let gone: Vec<Value> = get_json(format!("{base}/messages?to=u0@example.com")).await;
    assert!(gone.is_empty(), "the recipient index forgot it");

    let one = format!("{base}/messages/{}", ids[2]);
    assert_eq!(status_of(http.delete(&one)).await, 204);
    assert_eq!(status_of(http.get(&one)).await, 404);
    assert_eq!(status_of(http.delete(&one)).await, 404, "already gone");
    let bad = http.delete(format!("{base}/messages")).body("{\"IDs\": 3}");
    assert_eq!(status_of(bad).await, 400);

    let stats: Value = get_json(format!("{base}/stats")).await;
    assert_eq!(stats["delivered"], 4, "deleting ids keeps the counters");
    assert_eq!(
        status_of(http.delete(format!("{base}/messages"))).await,
        204
    );
    let all: Vec<Value> = get_json(format!("{base}/messages")).await;
    assert!(all.is_empty());
    let stats: Value = get_json(format!("{base}/stats")).await;
    assert_eq!(stats["delivered"], 0, "deleting everything resets them");
}
