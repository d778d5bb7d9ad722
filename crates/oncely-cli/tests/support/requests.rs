//! What the end-to-end tests do again and again, named once: the rows they count, request
//! bodies and builders, a client from a chosen loopback address, apps with mail caps or inbox
//! faults, the token or link of the `n`th email to an address, what a browser does with a link,
//! tokens aged past their expiry, and waiting on (and asserting) counted rows. The one polling
//! loop here replaces the tests' own.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use oncely_inbox::{Faults, Inbox, Message};
use serde_json::{Value, json};

use oncely_server::settings::Settings;

use crate::support::{
    TestApp, execute, mail_caps, spawn_app_on, spawn_app_with_inbox, start_inbox, token_in,
};

/// Users of every tenant.
pub const USERS: &str = "SELECT count(*) FROM oncely_users";
/// Verified users of every tenant.
pub const VERIFIED_USERS: &str = "SELECT count(*) FROM oncely_users WHERE status = 'verified'";
/// Verified users of the tenant `acme`.
pub const ACME_VERIFIED_USERS: &str =
    "SELECT count(*) FROM oncely_users WHERE tenant = 'acme' AND status = 'verified'";
/// Memberships of the tenant `acme`.
pub const ACME_MEMBERSHIPS: &str = "SELECT count(*) FROM oncely_memberships WHERE tenant = 'acme'";
/// Outbox jobs sent.
pub const SENT_JOBS: &str = "SELECT count(*) FROM oncely_outbox WHERE status = 'sent'";
/// Outbox jobs not yet sent nor skipped.
pub const PENDING_JOBS: &str = "SELECT count(*) FROM oncely_outbox WHERE status = 'pending'";
/// Attempts skipped because the client that asked was over its cap.
pub const CAPPED_BY_CLIENT: &str =
    "SELECT count(*) FROM oncely_outbox_attempts WHERE error LIKE '%from this client'";

/// `{"email": address}`: what asks for an email.
pub fn email(address: &str) -> Value {
    json!({ "email": address })
}

/// `{"token": token}`: what uses a link.
pub fn token(token: &str) -> Value {
    json!({ "token": token })
}

/// A POST of `path` on `base` with an Idempotency-Key; the caller adds the body, other headers,
/// and sends it.
pub fn idempotent_post(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    key: &str,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}{path}"))
        .header("idempotency-key", key)
}

/// The JSON answer to `request`, sent.
pub async fn json_of<T: serde::de::DeserializeOwned>(request: reqwest::RequestBuilder) -> T {
    request.send().await.unwrap().json().await.unwrap()
}

/// An HTTP client whose connections come from `source` (a loopback address).
pub fn client_from(source: &str) -> reqwest::Client {
    // Installs the TLS provider reqwest needs, as every test client does.
    let _ = oncely_testdb::http();
    reqwest::Client::builder()
        .local_address(source.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}

/// The app with these email caps (per address and per client); `configure` changes the rest of
/// its settings.
pub async fn app_with_mail_caps(
    url: &str,
    per_address: u32,
    per_client: u32,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    spawn_app_on(url, |s| {
        mail_caps(s, per_address, per_client);
        configure(s);
    })
    .await
}

/// The app, mailing to a fresh inbox that has `faults`.
pub async fn app_with_faults(url: &str, faults: Faults) -> TestApp {
    let (inbox, running) = start_inbox(faults).await;
    spawn_app_with_inbox(url, inbox, running, |_| {}).await
}

/// A fresh inbox and the `--mailer` URL that sends to it over SMTP.
pub async fn smtp_inbox() -> (Inbox, String) {
    let (inbox, running) = start_inbox(Faults::default()).await;
    (inbox, format!("smtp://{}", running.smtp_addr))
}

/// A signup of `address` (no API key, Idempotency-Key `key`), answered 202.
pub async fn sign_up(app: &TestApp, key: &str, address: &str) {
    let signup = app.post("/v1/signup", key, &email(address)).await;
    assert_eq!(signup.status(), 202);
}

/// Waits for `n` emails to `to` and returns the token of the `n`th.
pub async fn nth_token(app: &TestApp, to: &str, n: usize) -> String {
    token_in(&app.emails_to(to, n).await[n - 1])
}

/// Waits for `n` emails to `to` and returns the link in the `n`th.
pub async fn nth_link(app: &TestApp, to: &str, n: usize) -> String {
    link_in(&app.emails_to(to, n).await[n - 1])
}

/// The link in an email (`http…?token=…`).
pub fn link_in(message: &Message) -> String {
    let text = &message.text;
    let at = text.find("token=").expect("a link with a token");
    let start = text[..at].rfind("http").expect("an absolute link");
    text[start..]
        .split_whitespace()
        .next()
        .expect("the link")
        .to_owned()
}

/// What a browser does with a link: opens the page (no API key), then sends what its button
/// sends — the token the page embeds, to the URL the page was opened at (without its query),
/// with the page's own Idempotency-Key — adding `password` where the page has a password field.
pub async fn click(app: &TestApp, link: &str, password: Option<&str>) -> (u16, Value) {
    let page = app.client.get(link).send().await.unwrap();
    assert_eq!(page.status(), 200, "the page opens without an API key");
    let html = page.text().await.unwrap();
    assert!(
        html.contains("fetch(location.origin + location.pathname, "),
        "the page posts where it was opened: {html}"
    );
    let mut action = reqwest::Url::parse(link).expect("an absolute link");
    action.set_query(None);
    action.set_fragment(None);
    let token = between(&html, "{token: \"", "\"");
    assert!(!token.is_empty(), "the page carries the token: {html}");
    let mut body = json!({ "token": token });
    if let Some(password) = password {
        assert!(
            html.contains("id=\"password\""),
            "the page has no password field"
        );
        body["password"] = json!(password);
    }
    let key = uuid::Uuid::new_v4().to_string();
    let answer = app
        .client
        .post(action)
        .header("idempotency-key", &key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

/// [`click`] on the link in the `n`th email to `to`.
pub async fn click_nth(app: &TestApp, to: &str, n: usize, password: Option<&str>) -> (u16, Value) {
    click(app, &nth_link(app, to, n).await, password).await
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text.find(start).expect("marker in the page") + start.len();
    let to = text[from..].find(end).expect("end marker") + from;
    &text[from..to]
}

/// The last segment of a problem's `type` (`…/problems/token-invalid` → `token-invalid`).
pub fn problem_type(body: &Value) -> &str {
    body["type"]
        .as_str()
        .unwrap_or_default()
        .rsplit('/')
        .next()
        .unwrap()
}

/// Ages every token of `flow` past its expiry, in place (as if its lifetime had passed).
pub async fn expire_tokens(database_url: &str, flow: &str) {
    let past = if database_url.starts_with("postgres") {
        "now() - interval '1 hour'"
    } else {
        "0"
    };
    execute(
        database_url,
        &format!("UPDATE oncely_tokens SET expires_at = {past} WHERE flow = '{flow}'"),
    )
    .await;
}

/// Asserts what each query counts: `(query, expected)`.
pub async fn assert_counts(app: &TestApp, expected: &[(&str, i64)]) {
    for (query, n) in expected {
        assert_eq!(app.count(query).await, *n, "{query}");
    }
}

/// Polls `query` until `done` holds for its count or `within` has passed; whether it held.
pub async fn wait_for_count(
    app: &TestApp,
    query: &str,
    within: Duration,
    done: impl Fn(i64) -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if done(app.count(query).await) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Asserts that the outbox drains (nothing pending) within `within`.
pub async fn assert_drained(app: &TestApp, within: Duration) {
    assert!(
        wait_for_count(app, PENDING_JOBS, within, |n| n == 0).await,
        "the outbox drains"
    );
}
