//! The inbox receives webhooks (issue 17, item 5): Standard Webhooks signatures checked, every
//! copy kept, duplicates counted by `webhook-id`, faults, secrets never shown.
//!
//! Signatures are made here in Rust (an implementation independent of the inbox's, so the core
//! checks never skip) and, when it can be imported, by the reference Python package through
//! `scripts/standardwebhooks-check.py` (else those checks print `SKIPPED:`).

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hmac::{KeyInit, Mac};
use oncely_inbox::{Clock, Faults, Inbox, Verification};
use serde_json::{Value, json};
use time::OffsetDateTime;

use common::{get_text, json_of, reset};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OTHER: &str = "whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24=";
const WRONG: &str = "whsec_d3Jvbmctc2VjcmV0LW5vYm9keS1rbm93cw==";
/// The inbox's clock in most tests (and the timestamp of their deliveries).
const NOW: i64 = 1_900_000_000;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// `v1,<base64 HMAC-SHA256(key, id.timestamp.body)>`, the key being the base64 after `whsec_`:
/// written from the specification, not from the inbox's code.
fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let key = b64()
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", b64().encode(mac.finalize().into_bytes()))
}

/// Runs the reference verifier script in `mode` on `items`; `None` (with a visible `SKIPPED:`
/// line) when Python or the package is not there.
fn reference(mode: &str, items: &[Value]) -> Option<Vec<Value>> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/standardwebhooks-check.py"
    );
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let child = Command::new(&python)
        .arg(script)
        .arg(mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        println!("SKIPPED: {python} cannot be run: the reference standardwebhooks check");
        eprintln!("SKIPPED: {python} cannot be run: the reference standardwebhooks check");
        return None;
    };
    let mut stdin = child.stdin.take().unwrap();
    for item in items {
        writeln!(stdin, "{item}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    if out.status.code() == Some(3) {
        let why = String::from_utf8_lossy(&out.stderr);
        println!("{}", why.trim());
        eprintln!("{}", why.trim());
        return None;
    }
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), items.len());
    Some(lines)
}

/// The reference package's signature, when it is there.
fn reference_sign(secret: &str, id: &str, timestamp: i64, body: &str) -> Option<String> {
    let item = json!({ "secret": secret, "id": id, "timestamp": timestamp, "body": body });
    reference("sign", &[item]).map(|out| out[0]["signature"].as_str().unwrap().to_owned())
}

/// An inbox on a manual clock at [`NOW`], listening; its base URL.
async fn start_at_now() -> (Inbox, String) {
    let clock = Clock::manual(OffsetDateTime::from_unix_timestamp(NOW).unwrap());
    start(Inbox::new().with_clock(clock)).await
}

async fn start(inbox: Inbox) -> (Inbox, String) {
    let (inbox, running) = inbox.start_local_with(Faults::default()).await.unwrap();
    (inbox, format!("http://{}", running.http_addr))
}

/// A delivery: headers given as (name, value); the status and the body of the answer.
async fn deliver(base: &str, name: &str, headers: &[(&str, String)], body: &str) -> (u16, Value) {
    let mut request = oncely_testdb::http()
        .post(format!("{base}/webhooks/{name}"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (header, value) in headers {
        request = request.header(*header, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The three headers of a delivery signed with `signature`.
fn headers(id: &str, timestamp: i64, signature: String) -> Vec<(&'static str, String)> {
    vec![
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature),
    ]
}

async fn put_secrets(base: &str, name: &str, secrets: &[&str]) -> u16 {
    oncely_testdb::http()
        .put(format!("{base}/webhooks/{name}/secrets"))
        .json(&json!({ "secrets": secrets }))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn get_json(url: String) -> Value {
    let response = oncely_testdb::http().get(url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// What is wrong, the headers, the body, the problem the 401 names.
type Case<'a> = (&'a str, Vec<(&'static str, String)>, &'a str, &'a str);

fn event(n: u32) -> String {
    json!({ "type": "user.created", "timestamp": "2030-03-17T17:46:40Z", "data": { "n": n } })
        .to_string()
}

#[tokio::test]
async fn a_signature_of_the_reference_package_is_accepted_and_any_tampering_is_a_401_kept_as_invalid()
 {
    let (inbox, base) = start_at_now().await;
    assert_eq!(put_secrets(&base, "app", &[SECRET]).await, 204);
    let body = event(1);
    let ours = sign(SECRET, "msg_1", NOW, &body);
    match reference_sign(SECRET, "msg_1", NOW, &body) {
        Some(theirs) => assert_eq!(theirs, ours, "the reference package signs as we do"),
        None => println!("SKIPPED: the reference signature (the Rust one is used)"),
    }
    let signature = reference_sign(SECRET, "msg_1", NOW, &body).unwrap_or(ours);
    let (status, _) = deliver(
        &base,
        "app",
        &headers("msg_1", NOW, signature.clone()),
        &body,
    )
    .await;
    assert_eq!(status, 204);

    let six_minutes = 6 * 60;
    let mut one_byte = body.clone().into_bytes();
    *one_byte.last_mut().unwrap() = b' ';
    let one_byte = String::from_utf8(one_byte).unwrap();
    let without = |name: &str| {
        let mut h = headers("msg_1", NOW, signature.clone());
        h.retain(|(n, _)| *n != name);
        h
    };
    let cases: Vec<Case> = vec![
        (
            "a body changed by one byte",
            headers("msg_1", NOW, signature.clone()),
            &one_byte,
            "no_matching_signature",
        ),
        (
            "a timestamp 6 minutes old",
            headers(
                "msg_2",
                NOW - six_minutes,
                sign(SECRET, "msg_2", NOW - six_minutes, &body),
            ),
            &body,
            "timestamp_too_old",
        ),
        (
            "a timestamp 6 minutes ahead",
            headers(
                "msg_3",
                NOW + six_minutes,
                sign(SECRET, "msg_3", NOW + six_minutes, &body),
            ),
            &body,
            "timestamp_too_new",
        ),
        (
            "another id under the same signature",
            headers("msg_4", NOW, signature.clone()),
            &body,
            "no_matching_signature",
        ),
        (
            "a wrong secret",
            headers("msg_5", NOW, sign(WRONG, "msg_5", NOW, &body)),
            &body,
            "no_matching_signature",
        ),
        (
            "a timestamp that is not whole seconds",
            headers("msg_6", NOW, signature.clone())
                .into_iter()
                .map(|(n, v)| {
                    let v = if n == "webhook-timestamp" {
                        "soon".into()
                    } else {
                        v
                    };
                    (n, v)
                })
                .collect(),
            &body,
            "invalid_timestamp",
        ),
        (
            "no webhook-signature",
            without("webhook-signature"),
            &body,
            "missing_headers",
        ),
        (
            "no webhook-id",
            without("webhook-id"),
            &body,
            "missing_headers",
        ),
        (
            "no webhook-timestamp",
            without("webhook-timestamp"),
            &body,
            "missing_headers",
        ),
    ];
    for (what, headers, body, problem) in &cases {
        let (status, answer) = deliver(&base, "app", headers, body).await;
        assert_eq!(status, 401, "{what}");
        assert_eq!(answer["problem"], *problem, "{what}: {answer}");
        assert_eq!(answer["status"], 401, "{what}");
        assert!(answer["detail"].as_str().unwrap().len() > 10, "{what}");
        if let Some(header) = what.strip_prefix("no ") {
            assert_eq!(answer["detail"], format!("missing: {header}"), "says which");
        }
    }
    let kept = get_json(format!("{base}/webhooks?name=app")).await;
    let kept = kept.as_array().unwrap();
    assert_eq!(kept.len(), 1 + cases.len(), "every copy is kept");
    let verdicts: Vec<(&str, Option<&str>)> = kept
        .iter()
        .rev()
        .map(|w| (w["verdict"].as_str().unwrap(), w["problem"].as_str()))
        .collect();
    assert_eq!(verdicts[0], ("verified", None));
    for (n, (_, _, _, problem)) in cases.iter().enumerate() {
        assert_eq!(verdicts[n + 1], ("invalid", Some(*problem)));
    }
    // The copy as received: headers, body, its type.
    let first = &kept[kept.len() - 1];
    assert_eq!(first["webhook_id"], "msg_1");
    assert_eq!(first["timestamp"], NOW.to_string());
    assert_eq!(first["signature"], signature);
    assert_eq!(first["body"], body);
    assert_eq!(first["type"], "user.created");
    assert_eq!(first["name"], "app");
    let stats = inbox.stats().webhooks;
    assert_eq!(
        (
            stats.received,
            stats.invalid,
            stats.distinct,
            stats.duplicates
        ),
        (10, 9, 1, 0),
        "invalid copies are neither distinct nor duplicates: {stats:?}"
    );
}

#[tokio::test]
async fn the_reference_package_agrees_with_the_inbox_on_the_copies_it_kept() {
    // The system clock: the reference verifier checks timestamps against it.
    let (inbox, base) = start(Inbox::new()).await;
    inbox.set_webhook_secrets("app", [SECRET]).unwrap();
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let body = event(2);
    let good = headers("msg_a", now, sign(SECRET, "msg_a", now, &body));
    assert_eq!(deliver(&base, "app", &good, &body).await.0, 204);
    let tampered = format!("{body} ");
    assert_eq!(deliver(&base, "app", &good, &tampered).await.0, 401);
    let stale = now - 6 * 60;
    let old = headers("msg_b", stale, sign(SECRET, "msg_b", stale, &body));
    assert_eq!(deliver(&base, "app", &old, &body).await.0, 401);
    let kept = inbox.webhooks(Some("app"), None);
    let items: Vec<Value> = kept
        .iter()
        .map(|w| {
            json!({
                "secret": SECRET,
                "headers": {
                    "webhook-id": w.webhook_id,
                    "webhook-timestamp": w.timestamp,
                    "webhook-signature": w.signature,
                },
                "body": w.body,
            })
        })
        .collect();
    let Some(verdicts) = reference("verify", &items) else {
        return;
    };
    for (webhook, theirs) in kept.iter().zip(&verdicts) {
        assert_eq!(
            theirs["ok"].as_bool().unwrap(),
            webhook.verdict == Verification::Verified,
            "{webhook:?}: {theirs}"
        );
    }
    assert_eq!(
        kept.iter()
            .filter(|w| w.verdict == Verification::Verified)
            .count(),
        1
    );
}

#[tokio::test]
async fn one_matching_signature_among_several_passes_during_a_rotation() {
    let (inbox, base) = start_at_now().await;
    assert_eq!(put_secrets(&base, "app", &[SECRET, OTHER]).await, 204);
    let body = event(3);
    let garbage = "v1,bm90LWEtc2lnbmF0dXJl v1,!!! v2,abc";
    for (id, secret) in [("msg_old", SECRET), ("msg_new", OTHER)] {
        let several = format!(
            "{garbage} {} {}",
            sign(WRONG, id, NOW, &body),
            sign(secret, id, NOW, &body)
        );
        let (status, answer) = deliver(&base, "app", &headers(id, NOW, several), &body).await;
        assert_eq!(status, 204, "{id}: {answer}");
    }
    let only_wrong = format!("{garbage} {}", sign(WRONG, "msg_x", NOW, &body));
    let (status, _) = deliver(&base, "app", &headers("msg_x", NOW, only_wrong), &body).await;
    assert_eq!(status, 401);
    // A v2 signature is not a v1 one, even when its bytes would match.
    let v2 = sign(SECRET, "msg_y", NOW, &body).replacen("v1,", "v2,", 1);
    assert_eq!(
        deliver(&base, "app", &headers("msg_y", NOW, v2), &body)
            .await
            .0,
        401
    );
    // Replacing the secrets ends the old one.
    assert_eq!(put_secrets(&base, "app", &[OTHER]).await, 204);
    let old = sign(SECRET, "msg_z", NOW, &body);
    assert_eq!(
        deliver(&base, "app", &headers("msg_z", NOW, old), &body)
            .await
            .0,
        401
    );
    assert_eq!(inbox.stats().webhooks.distinct, 2);
}

#[tokio::test]
async fn without_a_secret_a_delivery_is_accepted_unverified_and_a_secret_must_be_whsec_base64() {
    let (inbox, base) = start_at_now().await;
    let body = event(4);
    let (status, _) = deliver(&base, "anyone", &[("webhook-id", "m1".into())], &body).await;
    assert_eq!(status, 204);
    let kept = inbox.webhooks(Some("anyone"), None);
    assert_eq!(kept[0].verdict, Verification::Unverified);
    assert_eq!(inbox.stats().webhooks.unverified, 1);
    // A secret for another name does not make this one checked.
    assert_eq!(put_secrets(&base, "app", &[SECRET]).await, 204);
    assert_eq!(deliver(&base, "anyone", &[], "x").await.0, 204);
    // A bad secret is refused, without being echoed, and changes nothing.
    let bad = "whsec_not*base64*at-all";
    let response = oncely_testdb::http()
        .put(format!("{base}/webhooks/app/secrets"))
        .json(&json!({ "secrets": [OTHER, bad] }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let text = response.text().await.unwrap();
    assert!(
        !text.contains("not*base64") && !text.contains(&OTHER[6..]),
        "{text}"
    );
    let signed = headers("m2", NOW, sign(SECRET, "m2", NOW, &body));
    assert_eq!(deliver(&base, "app", &signed, &body).await.0, 204);
    for wrong in [json!({ "secret": [SECRET] }), json!([SECRET]), json!({})] {
        let status = oncely_testdb::http()
            .put(format!("{base}/webhooks/app/secrets"))
            .json(&wrong)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 400, "{wrong}");
    }
    // An empty list forgets them: unverified again.
    assert_eq!(put_secrets(&base, "app", &[]).await, 204);
    assert_eq!(deliver(&base, "app", &[], &body).await.0, 204);
    assert_eq!(inbox.stats().webhooks.unverified, 3);
}

#[tokio::test]
async fn duplicates_are_counted_by_webhook_id_per_name_and_listed_newest_first_by_name_and_type() {
    let (inbox, base) = start_at_now().await;
    inbox.set_webhook_secrets("app", [SECRET]).unwrap();
    let send = |name: &'static str, id: &'static str, body: String| {
        let base = base.clone();
        async move {
            let h = headers(id, NOW, sign(SECRET, id, NOW, &body));
            deliver(&base, name, &h, &body).await.0
        }
    };
    let other_type = json!({ "type": "email.sent", "data": {} }).to_string();
    assert_eq!(send("app", "evt_1", event(1)).await, 204);
    assert_eq!(send("app", "evt_1", event(1)).await, 204);
    assert_eq!(send("app", "evt_2", other_type.clone()).await, 204);
    assert_eq!(send("app", "evt_1", event(1)).await, 204);
    // The same id at another endpoint is another delivery (unverified there).
    assert_eq!(send("other", "evt_1", event(1)).await, 204);
    // A forged copy of a known id is not a duplicate: it was refused.
    let forged = headers("evt_2", NOW, sign(WRONG, "evt_2", NOW, &other_type));
    assert_eq!(deliver(&base, "app", &forged, &other_type).await.0, 401);
    let stats: Value = get_json(format!("{base}/stats")).await;
    let w = &stats["webhooks"];
    assert_eq!(
        (
            w["received"].as_u64(),
            w["distinct"].as_u64(),
            w["duplicates"].as_u64(),
            w["invalid"].as_u64(),
            w["kept"].as_u64()
        ),
        (Some(6), Some(3), Some(2), Some(1), Some(6)),
        "{w}"
    );
    let app = get_json(format!("{base}/webhooks?name=app")).await;
    let ids: Vec<&str> = app
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["webhook_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["evt_2", "evt_1", "evt_2", "evt_1", "evt_1"],
        "newest first"
    );
    assert_eq!(
        inbox.webhook_ids("app"),
        [("evt_1".to_owned(), 3), ("evt_2".to_owned(), 1)].into(),
        "the forged copy is not counted"
    );
    let sent = get_json(format!("{base}/webhooks?type=email.sent")).await;
    assert_eq!(sent.as_array().unwrap().len(), 2);
    let typed = get_json(format!("{base}/webhooks?name=other&type=user.created")).await;
    assert_eq!(typed.as_array().unwrap().len(), 1);
    let one = &app[1];
    let by_id = get_json(format!("{base}/webhooks/{}", one["id"].as_str().unwrap())).await;
    assert_eq!(&by_id, one);
    let missing = oncely_testdb::http()
        .get(format!("{base}/webhooks/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    // The page shows the count of copies of evt_1.
    let page = get_text(format!("{base}/")).await;
    assert!(page.contains("×3"), "{page}");
}

#[tokio::test]
async fn webhook_faults_reject_with_the_status_chosen_and_leave_mail_alone() {
    let (inbox, base) = start_at_now().await;
    let http = oncely_testdb::http();
    let put = |patch: Value| http.put(format!("{base}/faults")).json(&patch);
    let set: Faults = json_of(put(
        json!({ "webhook_reject_next": 2, "webhook_reject_status": 410 }),
    ))
    .await;
    assert_eq!(
        (set.webhook_reject_next, set.webhook_reject_status),
        (2, 410)
    );
    for expected in [410, 410, 204] {
        assert_eq!(deliver(&base, "app", &[], "{}").await.0, expected);
    }
    let mail = http
        .post(format!("{base}/emails"))
        .json(&json!({ "from": "a@x.io", "to": "b@x.io", "subject": "s", "text": "t" }))
        .send()
        .await
        .unwrap();
    assert_eq!(mail.status(), 200, "mail has its own faults");
    put(json!({ "webhook_reject_next": 1, "webhook_reject_status": 500 }))
        .send()
        .await
        .unwrap();
    assert_eq!(deliver(&base, "app", &[], "{}").await.0, 500);
    put(json!({ "reject_next": 1 })).send().await.unwrap();
    assert_eq!(
        deliver(&base, "app", &[], "{}").await.0,
        204,
        "mail faults leave webhooks alone"
    );
    for bad in [
        json!({ "webhook_reject_status": 200 }),
        json!({ "webhook_reject_status": 99 }),
    ] {
        assert_eq!(
            put(bad.clone()).send().await.unwrap().status(),
            400,
            "{bad}"
        );
    }
    let stats = inbox.stats().webhooks;
    assert_eq!(
        (stats.rejected, stats.received, stats.kept),
        (3, 2, 2),
        "rejected: not kept"
    );
}

#[tokio::test]
async fn a_webhook_delay_holds_the_answer() {
    let (inbox, base) = start_at_now().await;
    inbox.set_faults(Faults {
        webhook_delay_ms: 300,
        ..Faults::default()
    });
    let started = Instant::now();
    assert_eq!(deliver(&base, "app", &[], "{}").await.0, 204);
    assert!(started.elapsed() >= Duration::from_millis(300));
    // Mail is not delayed by it: the webhook delay is its own.
    assert_eq!(inbox.faults().delay_ms, 0);
}

#[tokio::test]
async fn accept_then_drop_keeps_the_copy_and_closes_the_connection_without_an_answer() {
    let (inbox, base) = start_at_now().await;
    inbox.set_webhook_secrets("app", [SECRET]).unwrap();
    inbox.set_faults(Faults {
        webhook_drop_after_accept: 1,
        ..Faults::default()
    });
    let body = event(5);
    // Installs the TLS provider reqwest needs (another test of the process may not have: under
    // cargo-nextest each test is a process of its own).
    let _ = oncely_testdb::http();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let send = || {
        client
            .post(format!("{base}/webhooks/app"))
            .headers(
                headers("evt_d", NOW, sign(SECRET, "evt_d", NOW, &body))
                    .into_iter()
                    .map(|(n, v)| (n.parse().unwrap(), v.parse().unwrap()))
                    .collect(),
            )
            .body(body.clone())
            .send()
    };
    let error = send().await.expect_err("no answer");
    assert!(error.status().is_none(), "no status: {error:?}");
    assert!(!error.is_timeout(), "closed, not stalled: {error:?}");
    let kept = inbox.webhooks(Some("app"), None);
    assert_eq!(kept.len(), 1, "the copy is there");
    assert_eq!(kept[0].verdict, Verification::Verified);
    // The sender retries the same event: a duplicate, answered this time.
    assert_eq!(send().await.unwrap().status(), 204);
    let stats = inbox.stats().webhooks;
    assert_eq!((stats.dropped, stats.distinct, stats.duplicates), (1, 1, 1));
}

#[tokio::test]
async fn the_resolver_is_asked_for_a_name_without_secrets() {
    let asked = Arc::new(AtomicUsize::new(0));
    let resolver: oncely_inbox::SecretsResolver = {
        let asked = asked.clone();
        Arc::new(move |name: &str| {
            asked.fetch_add(1, Ordering::SeqCst);
            let secrets = match name {
                "app" => vec![SECRET.to_owned(), OTHER.to_owned()],
                "broken" => vec!["whsec_***".to_owned()],
                _ => vec![],
            };
            Box::pin(async move { secrets })
        })
    };
    let clock = Clock::manual(OffsetDateTime::from_unix_timestamp(NOW).unwrap());
    let (inbox, base) = start(
        Inbox::new()
            .with_clock(clock)
            .with_webhook_secrets_from(resolver),
    )
    .await;
    let body = event(6);
    let by = |secret: &str, id: &str| headers(id, NOW, sign(secret, id, NOW, &body));
    assert_eq!(deliver(&base, "app", &by(OTHER, "e1"), &body).await.0, 204);
    assert_eq!(deliver(&base, "app", &by(WRONG, "e2"), &body).await.0, 401);
    assert_eq!(
        deliver(&base, "nobody", &by(WRONG, "e3"), &body).await.0,
        204
    );
    let (status, answer) = deliver(&base, "broken", &by(SECRET, "e4"), &body).await;
    assert_eq!(
        (status, answer["problem"].as_str()),
        (401, Some("unusable_secret"))
    );
    assert_eq!(asked.load(Ordering::SeqCst), 4, "asked at every delivery");
    let verdicts: Vec<Verification> = inbox
        .webhooks(None, None)
        .iter()
        .rev()
        .map(|w| w.verdict)
        .collect();
    assert_eq!(
        verdicts,
        [
            Verification::Verified,
            Verification::Invalid,
            Verification::Unverified,
            Verification::Invalid
        ]
    );
    // Secrets set for a name win over the resolver, which is then not asked.
    inbox.set_webhook_secrets("app", [WRONG]).unwrap();
    assert_eq!(deliver(&base, "app", &by(WRONG, "e5"), &body).await.0, 204);
    assert_eq!(asked.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn secrets_appear_in_no_answer_and_no_page() {
    let (inbox, base) = start_at_now().await;
    let http = oncely_testdb::http();
    assert_eq!(put_secrets(&base, "app", &[SECRET, OTHER]).await, 204);
    let body = event(7);
    let signed = headers("evt_s", NOW, sign(SECRET, "evt_s", NOW, &body));
    assert_eq!(deliver(&base, "app", &signed, &body).await.0, 204);
    assert_eq!(deliver(&base, "app", &[], &body).await.0, 401);
    let id = inbox.webhooks(None, None)[0].id.clone();
    let mut seen = String::new();
    for path in [
        "/webhooks".to_owned(),
        "/webhooks?name=app".to_owned(),
        format!("/webhooks/{id}"),
        "/stats".to_owned(),
        "/faults".to_owned(),
        "/messages".to_owned(),
        "/".to_owned(),
        "/?q=app".to_owned(),
        "/webhooks/app/secrets".to_owned(),
    ] {
        let response = http.get(format!("{base}{path}")).send().await.unwrap();
        seen.push_str(&format!("{path} {}\n", response.status()));
        seen.push_str(&response.text().await.unwrap());
    }
    let put = http
        .put(format!("{base}/webhooks/app/secrets"))
        .json(&json!({ "secrets": [SECRET] }))
        .send()
        .await
        .unwrap();
    seen.push_str(&put.text().await.unwrap());
    assert!(seen.contains("evt_s"), "the copies were read: {seen}");
    for secret in [SECRET, OTHER] {
        let key = &secret["whsec_".len()..];
        assert!(!seen.contains(key), "{secret} shown");
        let key_unpadded = key.trim_end_matches('=');
        assert!(!seen.contains(key_unpadded), "{secret} shown");
    }
}

#[tokio::test]
async fn reset_forgets_webhooks_and_their_counters_and_delete_only_the_copies() {
    let (inbox, base) = start_at_now().await;
    let http = oncely_testdb::http();
    inbox.set_webhook_secrets("app", [SECRET]).unwrap();
    let body = event(8);
    let signed = headers("evt_r", NOW, sign(SECRET, "evt_r", NOW, &body));
    for _ in 0..2 {
        assert_eq!(deliver(&base, "app", &signed, &body).await.0, 204);
    }
    let deleted = http
        .delete(format!("{base}/webhooks"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(inbox.webhooks(None, None).is_empty());
    let stats = inbox.stats().webhooks;
    assert_eq!(
        (stats.received, stats.duplicates, stats.kept),
        (2, 1, 0),
        "counters stay"
    );
    assert_eq!(deliver(&base, "app", &signed, &body).await.0, 204);
    assert_eq!(inbox.stats().webhooks.duplicates, 1, "no kept copy had it");
    let reset = reset(&base).await;
    assert_eq!(reset.status(), 204);
    assert!(inbox.webhooks(None, None).is_empty());
    assert_eq!(
        inbox.stats().webhooks,
        oncely_inbox::WebhookStats::default()
    );
    // The secrets stay, like the faults: a wrong signature is still refused.
    let wrong = headers("evt_w", NOW, sign(WRONG, "evt_w", NOW, &body));
    assert_eq!(deliver(&base, "app", &wrong, &body).await.0, 401);
}

#[tokio::test]
async fn at_a_rebindable_name_only_the_webhook_intake_is_served() {
    let (inbox, base) = start_at_now().await;
    let http = oncely_testdb::http();
    inbox.set_webhook_secrets("app", [SECRET]).unwrap();
    let body = event(9);
    let host = "inbox:8025";
    let mut request = http
        .post(format!("{base}/webhooks/app"))
        .header("host", host)
        .body(body.clone());
    for (name, value) in headers("evt_h", NOW, sign(SECRET, "evt_h", NOW, &body)) {
        request = request.header(name, value);
    }
    assert_eq!(
        request.send().await.unwrap().status(),
        204,
        "a sender in a container network"
    );
    let refused = [
        http.get(format!("{base}/webhooks")).header("host", host),
        http.get(format!(
            "{base}/webhooks/{}",
            inbox.webhooks(None, None)[0].id
        ))
        .header("host", host),
        http.put(format!("{base}/webhooks/app/secrets"))
            .header("host", host)
            .json(&json!({ "secrets": [WRONG] })),
        http.delete(format!("{base}/webhooks")).header("host", host),
        http.post(format!("{base}/webhooks/app"))
            .header("host", host)
            .header("origin", format!("http://{host}"))
            .body("{}"),
    ];
    for request in refused {
        assert_eq!(request.send().await.unwrap().status(), 403);
    }
    // A cross-origin page cannot set secrets at localhost either.
    let cross = http
        .put(format!("{base}/webhooks/app/secrets"))
        .header("origin", "http://evil.test")
        .json(&json!({ "secrets": [WRONG] }))
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), 403);
    assert_eq!(inbox.webhooks(None, None).len(), 1);
    let wrong = headers("evt_x", NOW, sign(WRONG, "evt_x", NOW, &body));
    assert_eq!(
        deliver(&base, "app", &wrong, &body).await.0,
        401,
        "secrets unchanged"
    );
}

#[tokio::test]
async fn the_page_escapes_what_a_webhook_carries() {
    let (_inbox, base) = start_at_now().await;
    let body = json!({ "type": "<img src=x onerror=alert(1)>", "data": "</pre><script>alert(2)</script>" })
        .to_string();
    let evil = [("webhook-id", "<b id=x>".to_owned())];
    assert_eq!(deliver(&base, "a%3Cscript%3E", &evil, &body).await.0, 204);
    let page = get_text(format!("{base}/")).await;
    for raw in [
        "<img src=x",
        "<script>alert",
        "</pre><script>",
        "<b id=x>",
        "a<script>",
    ] {
        assert!(!page.contains(raw), "{raw} unescaped");
    }
    for escaped in [
        "&lt;img src=x onerror=alert(1)&gt;",
        "&lt;b id=x&gt;",
        "a&lt;script&gt;",
    ] {
        assert!(page.contains(escaped), "{escaped} missing");
    }
}
