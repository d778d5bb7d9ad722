//! The per-client email cap keys on the real client: the connection's peer address, or what a
//! configured trusted proxy forwarded. Clients come from several loopback source addresses.

use std::time::Duration;

use oncely_testdb::TestDb;

use crate::requests::{
    CAPPED_BY_CLIENT, app_with_mail_caps, assert_drained, client_from, email, idempotent_post,
};
use crate::support::{TestApp, both_databases};

both_databases!(
    each_client_address_has_its_own_email_cap,
    a_spoofed_forwarded_header_from_an_untrusted_peer_neither_escapes_nor_moves_its_bucket,
    behind_a_trusted_proxy_the_forwarded_client_is_the_bucket,
);

/// One signup: the client it comes from, the local part of its address (`a0` is
/// `a0@example.com`), and the forwarding header it carries, if any.
type Signup<'a> = (&'a reqwest::Client, &'a str, Option<(&'a str, &'a str)>);

/// Sends the signups in order (each answers 202 whatever the caps say), waits until every job
/// has been sent or skipped, and returns how many emails reached each address (0 or 1 here).
async fn delivered_after(app: &TestApp, signups: &[Signup<'_>]) -> Vec<usize> {
    for (client, who, header) in signups {
        let address = format!("{who}@example.com");
        let key = format!("signup-{address}");
        let mut request =
            idempotent_post(client, &app.base, "/v1/signup", &key).json(&email(&address));
        if let Some((name, value)) = header {
            request = request.header(*name, *value);
        }
        assert_eq!(request.send().await.unwrap().status(), 202);
    }
    assert_drained(app, Duration::from_secs(20)).await;
    signups
        .iter()
        .map(|(_, who, _)| {
            app.inbox
                .messages(Some(&format!("{who}@example.com")))
                .len()
        })
        .collect()
}

/// Regression: the server ran without connect info, so every request was client "unknown" and
/// one client exhausting the cap silenced every email of the tenant.
async fn each_client_address_has_its_own_email_cap(url: String, _db: TestDb) {
    let app = app_with_mail_caps(&url, 100, 2, |_| {}).await;
    let (a, b) = (client_from("127.0.0.2"), client_from("127.0.0.3"));
    let signups = [
        (&a, "a0", None),
        (&a, "a1", None),
        (&a, "a2", None),
        (&a, "a3", None),
        (&b, "b0", None),
        (&b, "b1", None),
    ];
    let sent = delivered_after(&app, &signups).await;
    assert_eq!(
        sent[..4],
        [1, 1, 0, 0],
        "127.0.0.2: two emails, then its cap"
    );
    assert_eq!(sent[4..], [1, 1], "127.0.0.3 has a cap of its own");
    assert_eq!(app.count(CAPPED_BY_CLIENT).await, 2);
}

/// Without a trusted proxy, `X-Forwarded-For` and `Forwarded` are the client's own words.
async fn a_spoofed_forwarded_header_from_an_untrusted_peer_neither_escapes_nor_moves_its_bucket(
    url: String,
    _db: TestDb,
) {
    let app = app_with_mail_caps(&url, 100, 2, |_| {}).await;
    let (a, b) = (client_from("127.0.0.2"), client_from("127.0.0.3"));
    let signups = [
        (&a, "a0", None),
        (&a, "a1", None),
        // 127.0.0.2 is at its cap; pretending to be someone else does not escape it.
        (&a, "a2", Some(("x-forwarded-for", "203.0.113.1"))),
        (&a, "a3", Some(("forwarded", "for=203.0.113.2"))),
        // 127.0.0.3 pretending to be 127.0.0.2 is still counted as 127.0.0.3.
        (&b, "b0", Some(("x-forwarded-for", "127.0.0.2"))),
        (&b, "b1", Some(("forwarded", "for=\"127.0.0.2:80\""))),
    ];
    let sent = delivered_after(&app, &signups).await;
    assert_eq!(sent, [1, 1, 0, 0, 1, 1]);
}

/// Behind a trusted proxy (the peer 127.0.0.1), the address it forwards is the client.
async fn behind_a_trusted_proxy_the_forwarded_client_is_the_bucket(url: String, _db: TestDb) {
    let trusted = ["127.0.0.1/32", "10.0.0.0/8"].map(|p| p.parse().unwrap());
    let app = app_with_mail_caps(&url, 100, 2, |s| s.trusted_proxies = trusted.to_vec()).await;
    let (proxy, untrusted) = (client_from("127.0.0.1"), client_from("127.0.0.4"));
    let xff = |v: &'static str| Some(("x-forwarded-for", v));
    let signups = [
        (&proxy, "c0", xff("127.0.0.9")),
        (&proxy, "c1", xff("127.0.0.9")),
        // 127.0.0.9's third email, however it is forwarded (a spoofed left part, another
        // trusted hop, the Forwarded header), is over its cap.
        (&proxy, "c2", xff("198.51.100.7, 127.0.0.9")),
        (&proxy, "c3", xff("127.0.0.9, 10.1.2.3")),
        (
            &proxy,
            "c4",
            Some(("forwarded", "for=127.0.0.9;proto=http")),
        ),
        // Other clients behind the same proxy have their own caps.
        (&proxy, "d0", xff("127.0.0.10")),
        (&proxy, "d1", Some(("forwarded", "for=\"[::1]:80\""))),
        // An untrusted peer's header is still ignored: 127.0.0.4 is its own client.
        (&untrusted, "e0", xff("127.0.0.9")),
    ];
    let sent = delivered_after(&app, &signups).await;
    assert_eq!(sent, [1, 1, 0, 0, 0, 1, 1, 1]);
}
