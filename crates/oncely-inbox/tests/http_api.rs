//! The inbox's HTTP API as a client (a test, an operator, the chaos run) uses it.

mod common;

use std::time::{Duration, Instant};

use oncely_inbox::{Clock, Faults, Inbox};
use serde_json::{Value, json};
use time::OffsetDateTime;

use common::{get_json, json_of, post_json, reset, text_of};

async fn start() -> (Inbox, String) {
    let (inbox, running) = Inbox::start_local(Faults::default()).await.unwrap();
    (inbox, format!("http://{}", running.http_addr))
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
    let set: Faults = json_of(http.put(format!("{base}/faults")).json(&faults)).await;
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
    let set: Value = json_of(http.put(format!("{base}/faults")).json(&faults)).await;
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
    assert_eq!(
        (stats["delivered"].as_u64(), stats["kept"].as_u64()),
        (Some(4), Some(0)),
        "deleting everything deletes messages, not what the counters counted"
    );
    // Not a form a web page could post to a developer's loopback inbox: JSON only.
    assert_eq!(status_of(http.post(format!("{base}/reset"))).await, 415);
    assert_eq!(reset(&base).await.status(), 204);
    let stats: Value = get_json(format!("{base}/stats")).await;
    assert_eq!(stats["delivered"], 0, "a reset starts the counters afresh");
}

/// The ids of every kept message, oldest first.
async fn ids(base: &str) -> Vec<String> {
    let all: Vec<Value> = get_json(format!("{base}/messages")).await;
    all.iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Review of issue 14, B: `DELETE /messages` with `{"ids": ["x"]}` deleted every message (the
/// lower-case field was ignored, so the body named no ids). Mailpit's field is read in any
/// case, as Go's JSON decoder reads it; a body with any other field is refused.
#[tokio::test]
async fn delete_reads_mailpits_ids_in_any_case_and_refuses_a_body_it_does_not_understand() {
    let (_inbox, base) = start().await;
    let http = oncely_testdb::http();
    for n in 0..5 {
        post_email(&base, &format!("k{n}"), &email("c@example.com")).await;
    }
    let all = ids(&base).await;
    for (n, field) in ["ids", "Ids", "IDS", "iDs"].into_iter().enumerate() {
        let body = json!({ field: [all[n]] });
        let delete = http.delete(format!("{base}/messages")).json(&body);
        assert_eq!(status_of(delete).await, 204, "{body}");
        assert_eq!(
            ids(&base).await,
            all[n + 1..],
            "{body} deletes that one only"
        );
    }
    for body in [
        json!({ "id": [all[4]] }),
        json!({ "IDs": [all[4]], "tag": "x" }),
        json!({ "messages": [] }),
        // Second review of issue 14: an array was read as the struct's fields, empty: all.
        json!([]),
        json!([all[4]]),
        json!("IDs"),
    ] {
        let delete = http.delete(format!("{base}/messages")).json(&body);
        assert_eq!(status_of(delete).await, 400, "{body}");
    }
    assert_eq!(ids(&base).await, all[4..], "a refused body deletes nothing");
}

/// Sends `{"subject": subject}` under idempotency key `key`; the status and the id answered.
async fn send_keyed(base: &str, key: &str, subject: &str) -> (u16, Option<String>) {
    let body = json!({ "from": "a@example.com", "to": ["k@example.com"], "subject": subject });
    let (status, _, answer) = post_email(base, key, &body).await;
    (status, answer["id"].as_str().map(str::to_owned))
}

/// Review of issue 14, B: deleting every message over HTTP also forgot provider mode's keys,
/// so the same key with another message was accepted as a new copy. A provider remembers a
/// key whatever becomes of the mailbox: `DELETE /messages` deletes messages only; `POST
/// /reset` (like `Inbox::clear`) is the full reset for a test that wants a fresh inbox.
#[tokio::test]
async fn deleting_every_message_keeps_provider_mode_keys_and_a_reset_forgets_them() {
    let (_inbox, running) = Inbox::start_local(Faults::provider()).await.unwrap();
    let base = format!("http://{}", running.http_addr);
    let http = oncely_testdb::http();
    let (status, first) = send_keyed(&base, "kk", "first").await;
    assert_eq!(status, 200);
    assert_eq!(
        status_of(http.delete(format!("{base}/messages"))).await,
        204
    );
    assert!(ids(&base).await.is_empty());
    assert_eq!(
        send_keyed(&base, "kk", "another").await,
        (409, None),
        "the key is still known, with its first message"
    );
    assert_eq!(
        send_keyed(&base, "kk", "first").await,
        (200, first),
        "a repeat is still answered with the first id"
    );
    assert!(ids(&base).await.is_empty(), "and not delivered again");

    // Not a form a web page could post to a developer's loopback inbox: JSON only.
    assert_eq!(status_of(http.post(format!("{base}/reset"))).await, 415);
    assert_eq!(reset(&base).await.status(), 204);
    let stats: Value = get_json(format!("{base}/stats")).await;
    assert_eq!(
        (stats["delivered"].as_u64(), stats["mismatched"].as_u64()),
        (Some(0), Some(0))
    );
    let faults: Faults = get_json(format!("{base}/faults")).await;
    assert_eq!(faults, Faults::provider(), "a reset keeps the faults");
    assert_eq!(send_keyed(&base, "kk", "another").await.0, 200, "forgotten");
}

/// `PUT /faults` with `body`: the status and the faults it answers.
async fn put_faults(base: &str, body: Value) -> (u16, Option<Faults>) {
    let response = oncely_testdb::http()
        .put(format!("{base}/faults"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.ok())
}

/// Review of issue 14, B: `PUT /faults {"throttle_next": 1}` on an inbox in provider mode
/// turned provider mode off (the fields it omitted took their defaults) and forgot every seen
/// key. `PUT /faults` changes only the fields it names; `{"dedupe_window_ms": null}` turns
/// provider mode off explicitly; no change of faults forgets a key (keys end with their window).
#[tokio::test]
async fn put_faults_changes_only_the_fields_it_names_and_never_forgets_a_key() {
    let clock = Clock::manual(OffsetDateTime::now_utc());
    let (_inbox, running) = Inbox::new()
        .with_clock(clock.clone())
        .start_local_with(Faults::provider())
        .await
        .unwrap();
    let base = format!("http://{}", running.http_addr);
    let (status, first) = send_keyed(&base, "kk", "first").await;
    assert_eq!(status, 200);

    let (status, set) = put_faults(&base, json!({ "throttle_next": 1 })).await;
    assert_eq!(status, 200);
    assert_eq!(
        set.unwrap(),
        Faults {
            throttle_next: 1,
            ..Faults::provider()
        },
        "provider mode stays on"
    );
    assert_eq!(send_keyed(&base, "other", "x").await.0, 429);
    assert_eq!(
        send_keyed(&base, "kk", "another").await.0,
        409,
        "the key is kept"
    );

    let (status, set) = put_faults(&base, json!({ "dedupe_window_ms": null })).await;
    assert_eq!((status, set.unwrap()), (200, Faults::default()));
    assert_eq!(
        send_keyed(&base, "kk", "another").await.0,
        200,
        "provider mode off: a new copy"
    );
    let (status, _) = put_faults(&base, json!({ "dedupe_window_ms": 86_400_000 })).await;
    assert_eq!(status, 200);
    assert_eq!(
        send_keyed(&base, "kk", "third").await.0,
        409,
        "turned on again, it still knows the key from before"
    );
    assert_eq!(send_keyed(&base, "kk", "first").await, (200, first));

    // A period of refused credentials runs from when it is named, and no later change of
    // other faults restarts or ends it.
    let (_, set) = put_faults(&base, json!({ "unauthorized_for_ms": 5000 })).await;
    assert_eq!(set.unwrap().unauthorized_for_ms, 5000);
    clock.advance(Duration::from_millis(1000));
    let (_, set) = put_faults(&base, json!({ "delay_ms": 0 })).await;
    assert_eq!(set.unwrap().unauthorized_for_ms, 4000);

    for (body, why) in [
        (json!({ "throttle_nxt": 1 }), "an unknown field"),
        (json!({ "throttle_next": -1 }), "a bad value"),
        (json!({ "throttle_next": null }), "null for a count"),
        (json!([1]), "not an object"),
    ] {
        let (status, _) = put_faults(&base, body).await;
        assert_eq!(status, 400, "{why}");
    }
    let faults: Faults = get_json(format!("{base}/faults")).await;
    assert_eq!(
        (faults.throttle_next, faults.dedupe_window_ms),
        (0, Some(86_400_000)),
        "a refused body changes nothing"
    );
}

/// Issue 15, item 7: a browser's request from another origin (a page on another site, or on
/// another port: same site) that would change the inbox is refused; the inbox's own page and
/// clients that are no browser are served as before.
#[tokio::test]
async fn a_browsers_cross_origin_request_cannot_change_the_inbox() {
    let (inbox, base) = start().await;
    let http = oncely_testdb::http();
    let host = base.trim_start_matches("http://").to_owned();
    let send = |extra: Option<(&'static str, String)>| {
        let mut request = http
            .post(format!("{base}/emails"))
            .json(&email("victim@example.com"));
        if let Some((name, value)) = extra {
            request = request.header(name, value);
        }
        request
    };
    assert_eq!(status_of(send(None)).await, 200);
    let id = inbox.messages(None)[0].id.clone();
    let foreign = [
        ("origin", "http://evil.example".to_owned()),
        ("origin", "null".to_owned()),
        ("origin", format!("http://{host}.evil.example")),
        ("origin", "http://127.0.0.1:1".to_owned()),
        ("sec-fetch-site", "cross-site".to_owned()),
        ("sec-fetch-site", "same-site".to_owned()),
    ];
    for (name, value) in &foreign {
        let requests = [
            http.delete(format!("{base}/messages")),
            http.delete(format!("{base}/messages/{id}")),
            http.put(format!("{base}/faults"))
                .json(&json!({ "reject_next": 5 })),
            http.post(format!("{base}/reset")).json(&json!({})),
            send(None),
        ];
        for request in requests {
            let response = request.header(*name, value).send().await.unwrap();
            assert_eq!(response.status(), 403, "{name}: {value}");
            assert!(
                response
                    .text()
                    .await
                    .unwrap()
                    .starts_with("refused: a request from another origin")
            );
        }
        // Reading is not refused here: the browser keeps a cross-origin answer from the page.
        let read = http.get(format!("{base}/messages")).header(*name, value);
        assert_eq!(status_of(read).await, 200);
    }
    assert_eq!(inbox.messages(None).len(), 1);
    assert_eq!(inbox.faults(), Faults::default());
    assert_eq!(inbox.stats().delivered, 1);
    // The page's own requests (same origin, as a browser marks them) are served.
    let own = http
        .delete(format!("{base}/messages/{id}"))
        .header("origin", format!("http://{}", host.to_uppercase()))
        .header("sec-fetch-site", "same-origin");
    assert_eq!(status_of(own).await, 204);
    assert!(inbox.messages(None).is_empty());
}

/// Issue 15, item 7: the raw source of a message, over each intake; not in the JSON list.
#[tokio::test]
async fn a_message_s_raw_source_is_served_as_text_and_left_out_of_the_json() {
    let (inbox, base) = start().await;
    let http = oncely_testdb::http();
    let sent = http
        .post(format!("{base}/emails"))
        .header("idempotency-key", "raw-1")
        .json(
            &json!({ "from": "a@example.com", "to": "r@example.com", "subject": "<b>Raw</b>",
                       "text": "hello" }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);
    let listed: Vec<Value> = get_json(format!("{base}/messages")).await;
    assert!(listed[0].get("raw").is_none(), "{listed:?}");
    let id = listed[0]["id"].as_str().unwrap();
    let raw = http
        .get(format!("{base}/messages/{id}/raw"))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.headers()["content-type"], "text/plain; charset=utf-8");
    assert_eq!(raw.headers()["x-content-type-options"], "nosniff");
    assert!(
        raw.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .starts_with("sandbox")
    );
    let raw = raw.text().await.unwrap();
    assert!(raw.starts_with("POST /emails\n"), "{raw}");
    assert!(raw.contains("Idempotency-Key: raw-1\n"), "{raw}");
    assert!(raw.contains("\"subject\": \"<b>Raw</b>\""), "{raw}");
    assert_eq!(
        status_of(http.get(format!("{base}/messages/nope/raw"))).await,
        404
    );

    // Over SMTP: the DATA section as sent.
    let smtp = inbox.start(
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    );
    let running = smtp.await.unwrap();
    let data = "From: a@example.com\r\nTo: s@example.com\r\nSubject: Over SMTP\r\n\
                Message-ID: <m1@x>\r\n\r\nBody line\r\n..dot-stuffed\r\n";
    smtp_send(running.smtp_addr, "s@example.com", data).await;
    let message = inbox
        .wait_for("s@example.com", 1, Duration::from_secs(5))
        .await;
    assert_eq!(
        message[0].raw,
        "From: a@example.com\r\nTo: s@example.com\r\nSubject: Over SMTP\r\nMessage-ID: <m1@x>\r\n\r\nBody line\r\n.dot-stuffed\r\n"
    );
}

/// One SMTP transaction of `data` to `to`, accepted.
async fn smtp_send(addr: std::net::SocketAddr, to: &str, data: &str) {
    let reply = smtp_send_maybe_dropped(addr, to, data).await;
    assert!(
        reply.as_deref().is_some_and(|r| r.starts_with("250")),
        "{reply:?}"
    );
}

/// Issue 15, item 7: the page searches by address or subject (on the server: it works without
/// script too), escapes what it shows, and allows no inline script.
#[tokio::test]
async fn the_page_searches_escapes_and_allows_no_inline_script() {
    let (_inbox, base) = start().await;
    let http = oncely_testdb::http();
    for (to, subject) in [
        ("ada@example.com", "Welcome <script>alert(1)</script>"),
        ("bob@example.com", "Reset your password"),
    ] {
        let sent = http
            .post(format!("{base}/emails"))
            .json(&json!({ "from": "app@example.com", "to": to, "subject": subject, "text": "x" }))
            .send()
            .await
            .unwrap();
        assert_eq!(sent.status(), 200);
    }
    let page = |q: &str| {
        let http = http.clone();
        let url = format!("{base}/?q={q}");
        async move {
            let response = http.get(url).send().await.unwrap();
            let csp = response.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .to_owned();
            assert!(
                csp.contains("script-src 'self'") && !csp.contains("unsafe"),
                "{csp}"
            );
            response.text().await.unwrap()
        }
    };
    let all = page("").await;
    assert!(all.contains("ada@example.com") && all.contains("bob@example.com"));
    assert!(all.contains("Welcome &lt;script&gt;alert(1)&lt;/script&gt;"));
    assert_eq!(
        all.matches("<script").count(),
        1,
        "only the page's own, by src"
    );
    assert!(all.contains("<script src=\"/assets/inbox.js\" defer></script>"));
    let by_address = page("BOB%40example").await;
    assert!(by_address.contains("bob@example.com") && !by_address.contains("ada@example.com"));
    let by_subject = page("welcome").await;
    assert!(by_subject.contains("ada@example.com") && !by_subject.contains("bob@example.com"));
    let none = page("%22%3E%3Cscript%3E").await;
    assert!(
        none.contains("No message to, from or about “&quot;&gt;&lt;script&gt;”"),
        "{none}"
    );
    assert!(
        none.contains("value=\"&quot;&gt;&lt;script&gt;\""),
        "the query is escaped"
    );
    let script = http
        .get(format!("{base}/assets/inbox.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        script.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
}

/// Issue 15, item 7 (threat model): DNS rebinding. A page at a name of the attacker's that then
/// resolves to the inbox's address is "same origin" with the inbox, so the Origin check lets it
/// through; the inbox answers browsers, and serves reads, only at a `Host` that no DNS answer
/// can change. Clients that are not browsers still send mail at a name (a container network).
#[tokio::test]
async fn a_rebound_name_reads_nothing_while_localhost_ip_and_a_named_mailer_are_served() {
    let (inbox, base) = start().await;
    let http = oncely_testdb::http();
    let port = base.rsplit(':').next().unwrap().to_owned();
    assert_eq!(
        status_of(
            http.post(format!("{base}/emails"))
                .json(&email("v@example.com"))
        )
        .await,
        200
    );
    let at = |host: String, request: reqwest::RequestBuilder| request.header("host", host);
    let evil = format!("evil.test:{port}");
    // A rebound page's requests: marked by the browser (fetch over https, or a POST's Origin),
    // and its plain same-origin GET over http, which Chromium marks with neither header.
    let rebound = [
        at(evil.clone(), http.get(format!("{base}/messages")))
            .header("sec-fetch-site", "same-origin"),
        at(evil.clone(), http.get(format!("{base}/messages"))),
        at(evil.clone(), http.get(format!("{base}/"))),
        at(
            evil.clone(),
            http.put(format!("{base}/faults"))
                .json(&json!({ "reject_next": 5 })),
        )
        .header("origin", format!("http://{evil}")),
        at(
            evil.clone(),
            http.post(format!("{base}/emails"))
                .json(&email("x@example.com")),
        )
        .header("origin", format!("http://{evil}")),
        at(
            "127.0.0.1.nip.io".to_owned(),
            http.get(format!("{base}/messages")),
        ),
        at(
            format!("localhost.evil.test:{port}"),
            http.get(format!("{base}/stats")),
        ),
    ];
    for request in rebound {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 403);
        let text = response.text().await.unwrap();
        assert!(
            text.contains(
                "the inbox answers browsers only at localhost or an IP address: DNS rebinding"
            ),
            "{text}"
        );
    }
    assert_eq!(inbox.messages(None).len(), 1);
    assert_eq!(inbox.faults(), Faults::default());
    // The same requests at localhost, a *.localhost name or an IP literal are served.
    for host in [
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("inbox.localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "[::1]".to_owned(),
    ] {
        let read = at(host.clone(), http.get(format!("{base}/messages")))
            .header("sec-fetch-site", "same-origin");
        assert_eq!(status_of(read).await, 200, "{host}");
        let change = at(
            host.clone(),
            http.put(format!("{base}/faults")).json(&json!({})),
        )
        .header("origin", format!("http://{host}"));
        assert_eq!(status_of(change).await, 200, "{host}");
    }
    // A mailer in a container network posts at the inbox's service name, no browser headers.
    let mailer = at("inbox:8025".to_owned(), http.post(format!("{base}/emails")))
        .json(&email("named@example.com"));
    assert_eq!(status_of(mailer).await, 200);
    assert_eq!(inbox.messages(Some("named@example.com")).len(), 1);
}

/// Issue 18: a message's HTML part is drawn on the message page in a sandboxed frame whose
/// source, `GET /view/{id}/html`, sandboxes itself: no script, no request elsewhere (a remote
/// image would tell the sender the message was read), no form, framed by the inbox only.
#[tokio::test]
async fn the_html_part_is_framed_sandboxed_and_served_with_a_policy_that_lets_it_only_be_drawn() {
    let (_inbox, base) = start().await;
    let http = oncely_testdb::http();
    let hostile = "<p style=\"color:red\">Grüße</p><script>alert(1)</script>\
                   <img src=\"http://127.0.0.1:9/x\" onerror=\"alert(2)\">\
                   <form action=\"http://127.0.0.1:9/steal\"><input name=p><button>go</button></form>\
                   <meta http-equiv=\"refresh\" content=\"0;url=http://127.0.0.1:9/\">\
                   </iframe><base href=\"http://127.0.0.1:9/\">";
    let mut ids = Vec::new();
    for body in [
        json!({ "from": "a@example.com", "to": "h@example.com", "subject": "html",
                "text": "text part", "html": hostile,
                "reply_to": ["Support <s@example.com>", "t@example.com"] }),
        json!({ "from": "a@example.com", "to": "t@example.com", "subject": "text only",
                "text": "text part" }),
    ] {
        let sent = http
            .post(format!("{base}/emails"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(sent.status(), 200);
        let sent: Value = sent.json().await.unwrap();
        ids.push(sent["id"].as_str().unwrap().to_owned());
    }
    let listed: Vec<Value> = get_json(format!("{base}/messages?to=h@example.com")).await;
    assert_eq!(listed[0]["html"], hostile);
    assert_eq!(
        listed[0]["reply_to"],
        "Support <s@example.com>, t@example.com"
    );

    let part = http
        .get(format!("{base}/view/{}/html", ids[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(part.status(), 200);
    let header = |name: &str| part.headers()[name].to_str().unwrap().to_owned();
    assert_eq!(header("content-type"), "text/html; charset=utf-8");
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert_eq!(header("cache-control"), "no-store");
    assert_eq!(header("referrer-policy"), "no-referrer");
    let csp: Vec<String> = header("content-security-policy")
        .split(';')
        .map(|d| d.trim().to_owned())
        .collect();
    for directive in [
        "sandbox",
        "default-src 'none'",
        "style-src 'unsafe-inline'",
        "img-src data:",
        "font-src data:",
        "form-action 'none'",
        "frame-ancestors 'self'",
    ] {
        assert!(csp.iter().any(|d| d == directive), "{directive}: {csp:?}");
    }
    assert!(
        !csp.iter()
            .any(|d| d.starts_with("script-src") || d.contains("allow-") || d.contains("http")),
        "no script, no sandbox exception, no remote source: {csp:?}"
    );
    assert_eq!(part.text().await.unwrap(), hostile, "the part as sent");

    // The message page frames it, sandboxed, and shows its source as text.
    let page = http
        .get(format!("{base}/view/{}", ids[0]))
        .send()
        .await
        .unwrap();
    let page_csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(page_csp.contains("frame-src 'self'"), "{page_csp}");
    assert!(page_csp.contains("frame-ancestors 'none'"), "{page_csp}");
    let page = page.text().await.unwrap();
    let frame = format!("<iframe id=\"html\" sandbox src=\"/view/{}/html\"", ids[0]);
    assert!(page.contains(&frame), "{page}");
    assert_eq!(
        page.matches("<iframe").count(),
        1,
        "the part's own is escaped"
    );
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{page}"
    );
    assert!(!page.contains("<script>alert"), "{page}");
    assert!(!page.contains("allow-"), "{page}");

    // No HTML: no frame, and nothing at the route; an unknown message: nothing either.
    let page = text_of(http.get(format!("{base}/view/{}", ids[1]))).await;
    assert!(
        page.contains("text part") && !page.contains("<iframe"),
        "{page}"
    );
    for id in [ids[1].as_str(), "nope", "..%2F..%2Fassets%2Finbox.js"] {
        assert_eq!(
            status_of(http.get(format!("{base}/view/{id}/html"))).await,
            404,
            "{id}"
        );
    }
    // Like every read, not at a name that DNS could rebind.
    assert_eq!(
        status_of(
            http.get(format!("{base}/view/{}/html", ids[0]))
                .header("host", "attacker.example:80")
        )
        .await,
        403
    );
}

/// One SMTP transaction of `data` to `to`, whose answer to the message may never come (the
/// inbox drops the connection after accepting): the reply to DATA's end, if any.
async fn smtp_send_maybe_dropped(
    addr: std::net::SocketAddr,
    to: &str,
    data: &str,
) -> Option<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    lines.next_line().await.unwrap();
    for command in [
        "HELO test".to_owned(),
        "MAIL FROM:<a@example.com>".to_owned(),
        format!("RCPT TO:<{to}>"),
        "DATA".to_owned(),
    ] {
        write
            .write_all(format!("{command}\r\n").as_bytes())
            .await
            .unwrap();
        let reply = lines.next_line().await.unwrap().unwrap();
        assert!(reply.starts_with('2') || reply.starts_with('3'), "{reply}");
        // EHLO-free: HELO answers one line.
    }
    write
        .write_all(format!("{data}.\r\n").as_bytes())
        .await
        .unwrap();
    let reply = lines.next_line().await.ok().flatten();
    if reply.is_some() {
        write.write_all(b"QUIT\r\n").await.ok();
    }
    reply
}

/// Issue 21, item 1: a sender whose answer was lost asks the inbox, as it would ask a provider,
/// whether it accepted delivery key K (`GET /deliveries/{K}`): by idempotency key (HTTP) or by
/// `Message-ID` `<K@host>` (SMTP), accepted-then-dropped included, a rejected one not; deleting
/// messages does not change the answer, a full reset does.
#[tokio::test]
async fn a_delivery_key_is_looked_up_as_a_provider_would_answer_for_it() {
    let (inbox, running) = Inbox::start_local(Faults::default()).await.unwrap();
    let base = format!("http://{}", running.http_addr);
    let http = oncely_testdb::http();
    let lookup = |key: &str| get_json::<Value>(format!("{base}/deliveries/{key}"));

    let never = lookup("never-sent").await;
    assert_eq!(
        (&never["accepted"], &never["copies"]),
        (&json!(false), &json!(0)),
        "{never}"
    );
    // Over HTTP, by idempotency key: rejected once (not accepted), then accepted twice.
    inbox.set_faults(Faults {
        reject_next: 1,
        ..Faults::default()
    });
    let send = || {
        http.post(format!("{base}/emails"))
            .header("idempotency-key", "k-http")
            .json(&email("h@example.com"))
    };
    assert_eq!(status_of(send()).await, 503);
    assert_eq!(lookup("k-http").await["accepted"], json!(false));
    assert_eq!(status_of(send()).await, 200);
    assert_eq!(status_of(send()).await, 200);
    let http_key = lookup("k-http").await;
    assert_eq!(
        (&http_key["accepted"], &http_key["copies"]),
        (&json!(true), &json!(2)),
        "{http_key}"
    );
    let first = inbox.messages(Some("h@example.com"))[0].id.clone();
    assert_eq!(http_key["first_id"], json!(first));
    assert!(http_key["first_accepted_at"].is_string(), "{http_key}");

    // Over SMTP, accepted and then the connection dropped before the answer: accepted, found
    // by the Message-ID's key and by the whole Message-ID.
    inbox.set_faults(Faults {
        drop_after_accept: 1,
        ..Faults::default()
    });
    let data = "From: a@example.com\r\nTo: s@example.com\r\nSubject: Lost answer\r\n\
                Message-ID: <k-smtp@oncely>\r\n\r\nBody\r\n";
    let reply = smtp_send_maybe_dropped(running.smtp_addr, "s@example.com", data).await;
    assert!(
        reply.as_deref().is_none_or(|r| !r.starts_with("250")),
        "the answer was dropped: {reply:?}"
    );
    assert_eq!(lookup("k-smtp").await["accepted"], json!(true));
    assert_eq!(lookup("k-smtp@oncely").await["accepted"], json!(true));
    assert_eq!(lookup("other@oncely").await["accepted"], json!(false));
    assert_eq!(
        lookup("k-smt").await["accepted"],
        json!(false),
        "exact keys only"
    );

    // The mailbox emptied: the answer stands. A full reset forgets it.
    let deleted = http
        .delete(format!("{base}/messages"))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success());
    assert!(inbox.messages(None).is_empty());
    assert_eq!(lookup("k-http").await["copies"], json!(2));
    assert_eq!(lookup("k-smtp").await["accepted"], json!(true));
    let reset = reset(&base).await;
    assert!(reset.status().is_success());
    assert_eq!(lookup("k-http").await["accepted"], json!(false));
}

/// Creates a run over HTTP; its JSON.
async fn create_run(base: &str) -> Value {
    let response = oncely_testdb::http()
        .post(format!("{base}/runs"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let run: Value = response.json().await.unwrap();
    run
}

/// Sends `email(to)` over HTTP, expecting it accepted.
async fn send_to(base: &str, to: &str) {
    let status = status_of(
        oncely_testdb::http()
            .post(format!("{base}/emails"))
            .json(&email(to)),
    )
    .await;
    assert_eq!(status, 200, "{to}");
}

/// Issue 21, item 2: two CI jobs sharing one inbox never see each other's mail.
#[tokio::test]
async fn runs_keep_each_jobs_mail_apart_and_are_listed_counted_and_deleted_by_run() {
    let (_inbox, base) = start().await;
    let http = oncely_testdb::http();
    let response = http.post(format!("{base}/runs")).send().await.unwrap();
    assert_eq!(response.status(), 201);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let a: Value = response.json().await.unwrap();
    let b = create_run(&base).await;
    let (a_id, b_id) = (a["run"].as_str().unwrap(), b["run"].as_str().unwrap());
    assert_eq!(location, format!("/runs/{a_id}"));
    assert_eq!(a["domain"], format!("{a_id}.run.test"));
    assert_eq!(a["tag"], a_id);
    send_to(&base, &format!("ada@{a_id}.run.test")).await;
    send_to(&base, &format!("bob+{a_id}@example.com")).await;
    send_to(&base, &format!("ada@{b_id}.run.test")).await;
    send_to(&base, "someone@example.com").await;
    // A throttled attempt to a run's address is answered 429 with Retry-After, and not kept.
    http.put(format!("{base}/faults"))
        .json(&json!({ "throttle_next": 1, "retry_after_s": 7 }))
        .send()
        .await
        .unwrap();
    let (status, retry_after, _) =
        post_email(&base, "t", &email(&format!("carol@{a_id}.run.test"))).await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("7")));

    let of_a: Vec<Value> = get_json(format!("{base}/messages?run={a_id}")).await;
    let to: Vec<&str> = of_a.iter().map(|m| m["to"][0].as_str().unwrap()).collect();
    assert_eq!(
        to,
        [
            format!("ada@{a_id}.run.test"),
            format!("bob+{a_id}@example.com")
        ]
    );
    let of_b: Vec<Value> = get_json(format!("{base}/messages?run={b_id}")).await;
    assert_eq!(of_b.len(), 1);
    let ada_of_b: Vec<Value> =
        get_json(format!("{base}/messages?run={b_id}&to=ADA@{a_id}.run.test")).await;
    assert!(
        ada_of_b.is_empty(),
        "to and run together: a's address is not b's"
    );
    let counted: Value = get_json(format!("{base}/runs/{a_id}")).await;
    assert_eq!(counted["messages"], 2);
    let runs: Vec<Value> = get_json(format!("{base}/runs")).await;
    assert_eq!(runs.len(), 2);

    let deleted = http
        .delete(format!("{base}/runs/{a_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    assert_eq!(deleted.json::<Value>().await.unwrap()["deleted"], 2);
    for gone in [
        http.get(format!("{base}/runs/{a_id}")),
        http.get(format!("{base}/messages?run={a_id}")),
        http.delete(format!("{base}/runs/{a_id}")),
    ] {
        let response = gone.send().await.unwrap();
        assert_eq!(response.status(), 404);
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let problem: Value = response.json().await.unwrap();
        assert!(problem["problem"] == "unknown_run", "{problem}");
    }
    let all: Vec<Value> = get_json(format!("{base}/messages")).await;
    assert_eq!(all.len(), 2, "b's message and the one outside any run stay");
}

/// The answer to `GET /messages/wait?{query}`: its status, body, and how long it took.
async fn wait(base: &str, query: &str) -> (u16, Value, Duration) {
    let started = Instant::now();
    let response = oncely_testdb::http()
        .get(format!("{base}/messages/wait?{query}"))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap(), started.elapsed())
}

#[tokio::test]
async fn a_wait_answers_as_soon_as_the_messages_arrive_and_at_its_timeout_what_there_is() {
    let (_inbox, base) = start().await;
    let run = create_run(&base).await;
    let id = run["run"].as_str().unwrap().to_owned();
    let waiting = tokio::spawn({
        let base = base.clone();
        let id = id.clone();
        async move { wait(&base, &format!("run={id}&count=2&timeout=30s")).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    send_to(&base, &format!("ada@{id}.run.test")).await;
    send_to(&base, "elsewhere@example.com").await;
    send_to(&base, &format!("bob@{id}.run.test")).await;
    let (status, body, took) = waiting.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        took < Duration::from_secs(5),
        "answered on arrival: {took:?}"
    );
    assert_eq!(
        (body["complete"].as_bool(), body["count"].as_u64()),
        (Some(true), Some(2))
    );
    assert_eq!(body["messages"][1]["to"][0], format!("bob@{id}.run.test"));

    let (status, body, took) = wait(
        &base,
        &format!("to=ADA@{id}.run.test&count=2&timeout=200ms"),
    )
    .await;
    assert_eq!(status, 408, "{body}");
    assert!(took >= Duration::from_millis(200));
    assert_eq!(
        (
            body["complete"].as_bool(),
            body["count"].as_u64(),
            body["wanted"].as_u64()
        ),
        (Some(false), Some(1), Some(2)),
        "what there is, at the timeout"
    );
    let (status, body, _) = wait(&base, &format!("to=ada@{id}.run.test&timeout=0")).await;
    assert_eq!(
        (status, body["count"].as_u64()),
        (200, Some(1)),
        "count defaults to 1"
    );
}

#[tokio::test]
async fn a_wait_with_a_bad_parameter_is_refused_with_the_reason() {
    let (_inbox, base) = start().await;
    for (query, reason) in [
        ("count=1", "name what to wait for"),
        ("to=&count=1", "an address to wait for"),
        ("to=%20&run=abc", "an address to wait for"),
        ("to=a@x.io&count=0", "count=\"0\""),
        ("to=a@x.io&count=many", "count=\"many\""),
        ("to=a@x.io&timeout=61s", "at most 60s"),
        ("to=a@x.io&timeout=2h", "at most 60s"),
        ("to=a@x.io&timeout=soon", "such as 500ms"),
        ("to=a@x.io&timeout=-1s", "such as 500ms"),
    ] {
        let (status, body, _) = wait(&base, query).await;
        assert_eq!(status, 400, "{query}");
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains(reason), "{query}: {detail}");
    }
    let (status, body, _) = wait(&base, "run=nosuchrun&timeout=1s").await;
    assert_eq!(
        (status, body["problem"].as_str()),
        (404, Some("unknown_run"))
    );
}

#[tokio::test]
async fn a_messages_links_and_one_time_codes_are_extracted_from_its_text_and_html() {
    let (inbox, base) = start().await;
    let body = json!({
        "from": "a@example.com", "to": ["ada@example.com"], "subject": "Verify",
        "text": "Confirm: http://127.0.0.1:8080/v1/verify?token=Ab_9-x.\nYour code is 493817.",
        "html": "<p><a href=\"http://127.0.0.1:8080/v1/verify?token=Ab_9-x\">Confirm</a> \
                 <a href='https://example.com/help?a=1&amp;code=XY12'>help</a></p>",
    });
    let sent: Value = post_json(format!("{base}/emails"), &body).await;
    let id = sent["id"].as_str().unwrap();
    let links: Value = get_json(format!("{base}/messages/{id}/links")).await;
    assert_eq!(
        links,
        json!({
            "id": id,
            "links": [
                "http://127.0.0.1:8080/v1/verify?token=Ab_9-x",
                "https://example.com/help?a=1&code=XY12",
            ],
            "codes": ["493817", "XY12"],
            "scanned": null,
        })
    );
    assert_eq!(inbox.links(id).unwrap().links.len(), 2);
    let unknown = oncely_testdb::http()
        .get(format!("{base}/messages/nope/links"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
}

/// A loopback site that records the path and query of every request it gets; `/missing` is
/// 404, `/redirect?to=URL` a 302 to `URL`.
async fn recording_site() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use axum::response::IntoResponse;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let app = axum::Router::new().fallback({
        let seen = seen.clone();
        move |request: axum::extract::Request| async move {
            let what = format!("{} {}", request.method(), request.uri());
            seen.lock().unwrap().push(what);
            let to = request.uri().query().and_then(|q| q.strip_prefix("to="));
            match (request.uri().path(), to) {
                ("/missing", _) => axum::http::StatusCode::NOT_FOUND.into_response(),
                ("/redirect", Some(to)) => (
                    axum::http::StatusCode::FOUND,
                    [(axum::http::header::LOCATION, to.to_owned())],
                )
                    .into_response(),
                _ => axum::http::StatusCode::OK.into_response(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), seen)
}

/// The scanner's record of message `id`, once it has one (within 5 s).
async fn scanned(base: &str, id: &str) -> Vec<Value> {
    for _ in 0..250 {
        let links: Value = get_json(format!("{base}/messages/{id}/links")).await;
        if let Some(scans) = links["scanned"].as_array() {
            return scans.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the scanner recorded nothing for {id}");
}

#[tokio::test]
async fn the_link_scanner_gets_every_loopback_link_on_arrival_and_never_another_host() {
    let (inbox, base) = start().await;
    let (site, seen) = recording_site().await;
    inbox.set_scan_origins([oncely_inbox::Origin::parse(&site).unwrap()]);
    let (status, set) = put_faults(&base, json!({ "link_scanner": true })).await;
    assert_eq!((status, set.map(|f| f.link_scanner)), (200, Some(true)));
    let body = json!({
        "from": "a@example.com", "to": ["ada@example.com"], "subject": "Links",
        "text": format!("{site}/verify?token=t1 and {site}/missing and \
                         http://example.com/never and https://127.0.0.1:1/tls"),
        "html": format!("<a href=\"{site}/verify?token=t1\">again, once</a>"),
    });
    let sent: Value = post_json(format!("{base}/emails"), &body).await;
    let scans = scanned(&base, sent["id"].as_str().unwrap()).await;
    let outcome: Vec<(String, Value, bool)> = scans
        .iter()
        .map(|s| {
            (
                s["url"].as_str().unwrap().to_owned(),
                s["status"].clone(),
                s["error"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("skipped")),
            )
        })
        .collect();
    assert_eq!(
        outcome,
        [
            (format!("{site}/verify?token=t1"), json!(200), false),
            (format!("{site}/missing"), json!(404), false),
            ("http://example.com/never".to_owned(), Value::Null, true),
            ("https://127.0.0.1:1/tls".to_owned(), Value::Null, true),
        ]
    );
    assert_eq!(
        *seen.lock().unwrap(),
        ["GET /verify?token=t1", "GET /missing"],
        "each loopback link once, with GET"
    );

    // Off again: a message's links are not fetched.
    put_faults(&base, json!({ "link_scanner": false })).await;
    let quiet = json!({ "from": "a@example.com", "to": ["b@example.com"], "subject": "s",
                        "text": format!("{site}/quiet") });
    let sent: Value = post_json(format!("{base}/emails"), &quiet).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let links: Value = get_json(format!(
        "{base}/messages/{}/links",
        sent["id"].as_str().unwrap()
    ))
    .await;
    assert!(links["scanned"].is_null());
    assert_eq!(seen.lock().unwrap().len(), 2);
}

/// Issue 36, item 4: over HTTP, a message over the per-message limit is 413 (not read in full),
/// and the kept messages stay within the byte budget, the oldest going first, while
/// `/deliveries/{key}` still answers for them.
#[tokio::test]
async fn the_http_intake_refuses_a_message_over_the_limit_and_keeps_within_the_byte_budget() {
    // A budget of 1 MiB: messages of at most 256 KiB as sent.
    let config = oncely_inbox::Config {
        retention: oncely_inbox::Retention {
            max_bytes: 1024 * 1024,
            ..oncely_inbox::Retention::default()
        },
        ..oncely_inbox::Config::default()
    };
    let (inbox, running) = Inbox::with_config(config)
        .start_local_with(Faults::default())
        .await
        .unwrap();
    let base = format!("http://{}", running.http_addr);
    let http = oncely_testdb::http();
    let send = |n: usize, len: usize| {
        http.post(format!("{base}/emails"))
            .header("idempotency-key", format!("k{n}"))
            .json(&json!({ "from": "a@example.com", "to": ["b@example.com"],
                           "subject": format!("m{n}"), "text": "t".repeat(len) }))
            .send()
    };
    let refused = send(0, 300 * 1024).await.unwrap();
    assert_eq!(refused.status(), 413);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["name"], "message_too_large", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("262144"),
        "{body}"
    );
    // 20 messages of 100 KiB (each kept as its text and its source: about 200 KiB).
    for n in 1..=20 {
        assert_eq!(send(n, 100 * 1024).await.unwrap().status(), 200, "m{n}");
    }
    let stats: Value = get_json(format!("{base}/stats")).await;
    let kept = stats["kept"].as_u64().unwrap();
    assert!((1..=5).contains(&kept), "within 1 MiB: {stats}");
    assert_eq!(stats["evicted"].as_u64().unwrap(), 20 - kept, "{stats}");
    assert_eq!(stats["too_large"], 1, "{stats}");
    let kept_bytes: usize = inbox
        .messages(None)
        .iter()
        .map(|m| m.text.len() + m.raw.len())
        .sum();
    assert!(kept_bytes <= 1024 * 1024, "{kept_bytes}");
    let newest = inbox.messages(None).pop().unwrap();
    assert_eq!(newest.subject, "m20", "the newest stays");
    assert!(
        newest.raw.contains(r#""subject":"m20""#),
        "a large body's source is kept as it came, not indented"
    );
    let first: Value = get_json(format!("{base}/deliveries/k1")).await;
    assert_eq!(first["accepted"], true, "an evicted message's key: {first}");
    assert!(inbox.message(first["first_id"].as_str().unwrap()).is_none());
    let never: Value = get_json(format!("{base}/deliveries/k0")).await;
    assert_eq!(never["accepted"], false, "the refused one was not accepted");
}

/// Issue 36, item 5: with the link scanner on, anyone who could post to the inbox made it GET
/// any loopback URL on any port (`http://127.0.0.1:21445/admin/delete?all=1`). It opens only
/// the origins its operator named: not another port of the machine, not through a user-info,
/// suffix or longer-port trick, not by a redirect; and it cannot be switched on over HTTP
/// while none is named.
#[tokio::test]
async fn the_link_scanner_opens_only_the_origins_its_operator_named() {
    let (inbox, base) = start().await;
    let (site, seen) = recording_site().await;
    let (other, other_seen) = recording_site().await;
    let (status, _) = put_faults(&base, json!({ "link_scanner": true })).await;
    assert_eq!(status, 400, "no origin named: it cannot be switched on");
    let refused = text_of(
        oncely_testdb::http()
            .put(format!("{base}/faults"))
            .body(r#"{"link_scanner": true}"#),
    )
    .await;
    assert!(refused.contains("--scan-origin"), "{refused}");
    assert!(!inbox.faults().link_scanner);
    // Named as the operator writes it: the case and a trailing slash make no difference.
    inbox.set_scan_origins([
        oncely_inbox::Origin::parse(&format!("{}/", site.to_uppercase())).unwrap(),
    ]);
    let (status, _) = put_faults(&base, json!({ "link_scanner": true })).await;
    assert_eq!(status, 200);
    let (site_port, other_port) = (
        site.rsplit(':').next().unwrap(),
        other.rsplit(':').next().unwrap(),
    );
    let links = [
        format!("{other}/admin/delete?all=1"),
        format!("http://127.0.0.1:{site_port}@127.0.0.1:{other_port}/userinfo"),
        format!("http://127.0.0.1:{site_port}.evil/suffix"),
        format!("http://127.0.0.1:{site_port}0/longer-port"),
        format!("http://localhost:{other_port}/by-name"),
        format!("http://127.0.0.2:{other_port}/another-loopback-address"),
        format!("{site}/redirect?to={other}/redirected"),
        format!("{site}/verify?token=t2"),
    ];
    let body = json!({
        "from": "a@example.com", "to": ["ada@example.com"], "subject": "Links",
        "text": links.join(" \n"),
    });
    let sent: Value = post_json(format!("{base}/emails"), &body).await;
    let scans = scanned(&base, sent["id"].as_str().unwrap()).await;
    let outcome: Vec<(String, Value)> = scans
        .iter()
        .map(|s| (s["url"].as_str().unwrap().to_owned(), s["status"].clone()))
        .collect();
    let expected: Vec<(String, Value)> = links
        .iter()
        .map(|link| {
            let status = if link.ends_with("/redirected") {
                json!(302)
            } else if link.ends_with("token=t2") {
                json!(200)
            } else {
                Value::Null
            };
            (link.clone(), status)
        })
        .collect();
    assert_eq!(outcome, expected, "{scans:?}");
    for skipped in &scans[..6] {
        let error = skipped["error"].as_str().unwrap();
        assert!(error.starts_with("skipped"), "{error}");
    }
    assert!(
        scans[0]["error"]
            .as_str()
            .unwrap()
            .contains(&format!("it opens {site}")),
        "{scans:?}"
    );
    assert_eq!(
        *seen.lock().unwrap(),
        [
            format!("GET /redirect?to={other}/redirected"),
            "GET /verify?token=t2".to_owned()
        ],
        "the named origin's links, each once"
    );
    assert!(
        other_seen.lock().unwrap().is_empty(),
        "another port of the machine was fetched: {:?}",
        other_seen.lock().unwrap()
    );
}

/// Review 3, F2: `POST /emails` takes at most `MAX_RECIPIENTS` recipients in `to`, `cc` and
/// `bcc` together (8 posts of ~715k recipients reached 888 MB): one more is 422
/// `validation_error` saying so, nothing kept; at the limit, the message is kept.
#[tokio::test]
async fn the_http_intake_refuses_more_recipients_than_the_limit() {
    let (inbox, base) = start().await;
    let max = oncely_inbox::MAX_RECIPIENTS;
    let addresses = |n: usize, tag: &str| -> Vec<String> {
        (0..n).map(|i| format!("{tag}{i}@example.com")).collect()
    };
    for body in [
        json!({ "from": "a@example.com", "to": addresses(max + 1, "t"), "subject": "s", "text": "t" }),
        json!({ "from": "a@example.com", "to": addresses(max - 1, "t"), "cc": "c@example.com",
                "bcc": ["b@example.com"], "subject": "s", "text": "t" }),
    ] {
        let (status, _, answer) = post_email(&base, "", &body).await;
        assert_eq!(status, 422, "{answer}");
        assert_eq!(answer["name"], "validation_error", "{answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(
            message.contains("Too many recipients") && message.contains(&max.to_string()),
            "{answer}"
        );
    }
    assert!(inbox.messages(None).is_empty());
    let at_limit = json!({ "from": "a@example.com", "to": addresses(max - 2, "t"),
                           "cc": ["c@example.com"], "bcc": "b@example.com",
                           "subject": "s", "text": "t" });
    let (status, _, answer) = post_email(&base, "", &at_limit).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(inbox.messages(None)[0].to.len(), max - 2);
}
