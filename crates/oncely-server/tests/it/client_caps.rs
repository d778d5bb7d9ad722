//! The per-client email cap keys on the real client: the connection's peer address, or what a
//! configured trusted proxy forwarded. Clients come from several loopback source addresses.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use oncely_testdb::TestDb;
use serde_json::json;

use crate::support::{TestApp, both_databases, mail_caps, spawn_app_on};

both_databases!(
    each_client_address_has_its_own_email_cap,
    a_spoofed_forwarded_header_from_an_untrusted_peer_neither_escapes_nor_moves_its_bucket,
    behind_a_trusted_proxy_the_forwarded_client_is_the_bucket,
);

/// An HTTP client whose connections come from `source` (a loopback address).
fn client_from(source: &str) -> reqwest::Client {
    let _ = oncely_testdb::http();
    reqwest::Client::builder()
        .local_address(source.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}

/// A signup for `email` from `client`, with extra headers; answers 202 whatever the caps say.
async fn signup(app: &TestApp, client: &reqwest::Client, email: &str, headers: &[(&str, &str)]) {
    let mut request = client
        .post(format!("{}/v1/signup", app.base))
        .header("idempotency-key", format!("signup-{email}"))
        .json(&json!({ "email": email }));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    assert_eq!(request.send().await.unwrap().status(), 202);
}

/// Waits until every job has been sent or skipped.
async fn settled(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while app
        .count("SELECT count(*) FROM oncely_outbox WHERE status = 'pending'")
        .await
        > 0
    {
        assert!(Instant::now() < deadline, "the outbox did not drain");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// How many emails reached `email` (0 or 1 here).
fn delivered(app: &TestApp, email: &str) -> usize {
    app.inbox.messages(Some(email)).len()
}

async fn capped_app(url: &str, trusted_proxies: &[&str]) -> TestApp {
    spawn_app_on(url, |s| {
        mail_caps(s, 100, 2);
        s.trusted_proxies = trusted_proxies.iter().map(|p| p.parse().unwrap()).collect();
    })
    .await
}

/// Regression: the server ran without connect info, so every request was client "unknown" and
/// one client exhausting the cap silenced every email of the tenant.
async fn each_client_address_has_its_own_email_cap(url: String, _db: TestDb) {
    let app = capped_app(&url, &[]).await;
    let (a, b) = (client_from("127.0.0.2"), client_from("127.0.0.3"));
    for i in 0..4 {
        signup(&app, &a, &format!("a{i}@example.com"), &[]).await;
    }
    for i in 0..2 {
        signup(&app, &b, &format!("b{i}@example.com"), &[]).await;
    }
    settled(&app).await;
    let a_sent: Vec<_> = (0..4)
        .map(|i| delivered(&app, &format!("a{i}@example.com")))
        .collect();
    assert_eq!(a_sent, [1, 1, 0, 0], "127.0.0.2: two emails, then its cap");
    let b_sent: Vec<_> = (0..2)
        .map(|i| delivered(&app, &format!("b{i}@example.com")))
        .collect();
    assert_eq!(b_sent, [1, 1], "127.0.0.3 has a cap of its own");
    assert_eq!(
        app.count(
            "SELECT count(*) FROM oncely_outbox_attempts WHERE error LIKE '%from this client'"
        )
        .await,
        2
    );
}

/// Without a trusted proxy, `X-Forwarded-For` and `Forwarded` are the client's own words.
async fn a_spoofed_forwarded_header_from_an_untrusted_peer_neither_escapes_nor_moves_its_bucket(
    url: String,
    _db: TestDb,
) {
    let app = capped_app(&url, &[]).await;
    let (a, b) = (client_from("127.0.0.2"), client_from("127.0.0.3"));
    signup(&app, &a, "a0@example.com", &[]).await;
    signup(&app, &a, "a1@example.com", &[]).await;
    // 127.0.0.2 is at its cap; pretending to be someone else does not escape it.
    signup(
        &app,
        &a,
        "a2@example.com",
        &[("x-forwarded-for", "203.0.113.1")],
    )
    .await;
    signup(
        &app,
        &a,
        "a3@example.com",
        &[("forwarded", "for=203.0.113.2")],
    )
    .await;
    // 127.0.0.3 pretending to be 127.0.0.2 is still counted as 127.0.0.3.
    signup(
        &app,
        &b,
        "b0@example.com",
        &[("x-forwarded-for", "127.0.0.2")],
    )
    .await;
    signup(
        &app,
        &b,
        "b1@example.com",
        &[("forwarded", "for=\"127.0.0.2:80\"")],
    )
    .await;
    settled(&app).await;
    let sent: Vec<_> = ["a0", "a1", "a2", "a3", "b0", "b1"]
        .iter()
        .map(|who| delivered(&app, &format!("{who}@example.com")))
        .collect();
    assert_eq!(sent, [1, 1, 0, 0, 1, 1]);
}

/// Behind a trusted proxy (the peer 127.0.0.1), the address it forwards is the client.
async fn behind_a_trusted_proxy_the_forwarded_client_is_the_bucket(url: String, _db: TestDb) {
    let app = capped_app(&url, &["127.0.0.1/32", "10.0.0.0/8"]).await;
    let proxy = client_from("127.0.0.1");
    let xff = |v: &'static str| [("x-forwarded-for", v)];
    signup(&app, &proxy, "c0@example.com", &xff("127.0.0.9")).await;
    signup(&app, &proxy, "c1@example.com", &xff("127.0.0.9")).await;
    // 127.0.0.9's third email, however it is forwarded (a spoofed left part, another trusted
    // hop, the Forwarded header), is over its cap.
    signup(
        &app,
        &proxy,
        "c2@example.com",
        &xff("198.51.100.7, 127.0.0.9"),
    )
    .await;
    signup(&app, &proxy, "c3@example.com", &xff("127.0.0.9, 10.1.2.3")).await;
    signup(
        &app,
        &proxy,
        "c4@example.com",
        &[("forwarded", "for=127.0.0.9;proto=http")],
    )
    .await;
    // Other clients behind the same proxy have their own caps.
    signup(&app, &proxy, "d0@example.com", &xff("127.0.0.10")).await;
    signup(
        &app,
        &proxy,
        "d1@example.com",
        &[("forwarded", "for=\"[::1]:80\"")],
    )
    .await;
    // An untrusted peer's header is still ignored: 127.0.0.4 is its own client.
    signup(
        &app,
        &client_from("127.0.0.4"),
        "e0@example.com",
        &xff("127.0.0.9"),
    )
    .await;
    settled(&app).await;
    let sent: Vec<_> = ["c0", "c1", "c2", "c3", "c4", "d0", "d1", "e0"]
        .iter()
        .map(|who| delivered(&app, &format!("{who}@example.com")))
        .collect();
    assert_eq!(sent, [1, 1, 0, 0, 0, 1, 1, 1]);
}
