//! What the memory tests share: the process's resident set, an inbox with a budget, a message.
#![allow(dead_code)]

use std::time::Duration;

use oncely_inbox::{Config, Inbox, Intake, Message, Retention};
use time::OffsetDateTime;

/// The process's resident set, in bytes.
pub(crate) fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

pub(crate) const MIB: usize = 1024 * 1024;

pub(crate) fn message(to: Vec<String>, message_id: Option<String>) -> Message {
    Message {
        id: String::new(),
        intake: Intake::Http,
        received_at: OffsetDateTime::UNIX_EPOCH,
        from: "a@x.io".into(),
        to,
        subject: "s".into(),
        text: "t".into(),
        html: None,
        reply_to: None,
        message_id,
        idempotency_key: None,
        raw: String::new(),
    }
}

pub(crate) fn inbox(max_bytes: usize) -> Inbox {
    Inbox::with_config(Config {
        retention: Retention {
            max_messages: 10_000,
            max_age: Duration::from_secs(3600),
            max_bytes,
        },
        ..Config::default()
    })
}

/// The JSON answer to a GET of `url`.
pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(url: impl reqwest::IntoUrl) -> T {
    let response = oncely_testdb::http().get(url).send().await.unwrap();
    response.json().await.unwrap()
}

/// The text answer to a GET of `url`.
pub(crate) async fn get_text(url: impl reqwest::IntoUrl) -> String {
    let response = oncely_testdb::http().get(url).send().await.unwrap();
    response.text().await.unwrap()
}

/// The JSON answer to a POST of `body` (as JSON) to `url`.
pub(crate) async fn post_json(
    url: impl reqwest::IntoUrl,
    body: &serde_json::Value,
) -> serde_json::Value {
    let response = oncely_testdb::http()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    response.json().await.unwrap()
}

/// The JSON answer to `request`, sent.
pub(crate) async fn json_of<T: serde::de::DeserializeOwned>(request: reqwest::RequestBuilder) -> T {
    request.send().await.unwrap().json().await.unwrap()
}

/// The text answer to `request`, sent.
pub(crate) async fn text_of(request: reqwest::RequestBuilder) -> String {
    request.send().await.unwrap().text().await.unwrap()
}

/// `POST /reset` (JSON) to the inbox at `base`: its answer.
pub(crate) async fn reset(base: &str) -> reqwest::Response {
    oncely_testdb::http()
        .post(format!("{base}/reset"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap()
}
