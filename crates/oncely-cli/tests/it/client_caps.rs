//! The per-client email cap keys on the real client: the connection's peer address, or what a
//! configured trusted proxy forwarded, or — with a tenant's API key — the user the backend names.
//! Clients come from several loopback source addresses.

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
    a_tenants_backend_is_not_one_client_the_user_it_names_is,
    first_emails_of_new_clients_stop_at_the_hard_ceiling,
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

/// Review of issue 16: a request with a tenant's API key comes from the application's backend,
/// and its one address was the client of every user: past the per-client cap every email of
/// the tenant was suppressed. The client is the user the backend names in `Oncely-Client-IP`;
/// without it, unknown (the per-address caps still hold); a value that is not one address is a
/// 400.
async fn a_tenants_backend_is_not_one_client_the_user_it_names_is(url: String, _db: TestDb) {
    let app = app_with_mail_caps(&url, 100, 2, |_| {}).await;
    let api_key = app.create_tenant("acme").await;
    let signup = async |who: &str, user: Option<&str>| {
        let address = format!("{who}@example.com");
        let mut request = idempotent_post(&app.client, &app.base, "/v1/signup", who)
            .bearer_auth(&api_key)
            .json(&email(&address));
        if let Some(user) = user {
            request = request.header("oncely-client-ip", user);
        }
        request.send().await.unwrap().status().as_u16()
    };
    for (who, user) in [
        ("a0", Some("203.0.113.7")),
        ("a1", Some("203.0.113.7")),
        ("a2", Some("203.0.113.7")),
        ("b0", Some("198.51.100.9")),
        ("n0", None),
        ("n1", None),
        ("n2", None),
    ] {
        assert_eq!(signup(who, user).await, 202, "{who}");
    }
    assert_drained(&app, Duration::from_secs(20)).await;
    let sent: Vec<usize> = ["a0", "a1", "a2", "b0", "n0", "n1", "n2"]
        .iter()
        .map(|who| {
            app.inbox
                .messages(Some(&format!("{who}@example.com")))
                .len()
        })
        .collect();
    assert_eq!(
        sent[..3],
        [1, 1, 0],
        "203.0.113.7: two emails, then its cap"
    );
    assert_eq!(
        sent[3], 1,
        "another user of the same backend has a cap of its own"
    );
    assert_eq!(sent[4..], [1, 1, 1], "no user named: not the backend's cap");
    assert_eq!(app.count(CAPPED_BY_CLIENT).await, 1);
    for bad in ["backend", "203.0.113.7, 198.51.100.9", ""] {
        assert_eq!(signup("bad", Some(bad)).await, 400, "{bad:?}");
    }
}

/// Second review of issue 16: each new client's first email passes the per-address total, and a
/// backend may name any client: twelve magic links from twelve named addresses reached one
/// mailbox whose total was four. No mailbox gets more than twice its total in a window.
async fn first_emails_of_new_clients_stop_at_the_hard_ceiling(url: String, _db: TestDb) {
    let app = app_with_mail_caps(&url, 1, 1000, |s| s.limits.per_address_total = 4).await;
    let api_key = app.create_tenant("acme").await;
    let address = "target@example.com";
    for i in 1..=12 {
        let response = idempotent_post(&app.client, &app.base, "/v1/invites", &format!("i{i}"))
            .bearer_auth(&api_key)
            .header("oncely-client-ip", format!("198.51.100.{i}"))
            .json(&email(address))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
    }
    assert_drained(&app, Duration::from_secs(20)).await;
    assert_eq!(app.inbox.messages(Some(address)).len(), 8);
}

/// Review of issue 20: the client's email allowance was counted before the request claimed its
/// key, so copies of one signup that lost the claim (answered as replays, 409s or 422s) each
/// spent one, and the client's next real signups were silenced. Here the first copy is held
/// in its transaction (an uncommitted insert of its address blocks it) while three more copies
/// of the same request pass the replay probe and reach the handler; the client's cap is 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_one_signup_that_lose_the_claim_spend_none_of_the_clients_emails() {
    use sqlx::{Connection, Executor};

    let (url, _db) = crate::support::postgres_db().await;
    let app = app_with_mail_caps(&url, 100, 3, |_| {}).await;
    let mut hold = sqlx::PgConnection::connect(&url).await.unwrap();
    hold.execute("BEGIN").await.unwrap();
    hold.execute(
        "INSERT INTO oncely_users (id, tenant, email, source, created_at)
         VALUES (gen_random_uuid(), 'default', 'dup@example.com', NULL, now())",
    )
    .await
    .unwrap();
    let client = client_from("127.0.0.7");
    let copies: Vec<_> = (0..4)
        .map(|_| {
            let request = idempotent_post(&client, &app.base, "/v1/signup", "dup")
                .json(&email("dup@example.com"));
            tokio::spawn(async move { request.send().await.unwrap().status().as_u16() })
        })
        .collect();
    // Every copy is in the server by now: the first waits on the held address, the others on
    // the first's key.
    tokio::time::sleep(Duration::from_millis(500)).await;
    hold.execute("ROLLBACK").await.unwrap();
    for copy in copies {
        let status = copy.await.unwrap();
        assert!(matches!(status, 202 | 409), "{status}");
    }
    let delivered =
        delivered_after(&app, &[(&client, "new0", None), (&client, "new1", None)]).await;
    assert_eq!(delivered, [1, 1], "the client's 2nd and 3rd emails");
    assert_eq!(app.inbox.messages(Some("dup@example.com")).len(), 1);
    assert_eq!(crate::support::count(&url, CAPPED_BY_CLIENT).await, 0);
}
