//! Signup and verification, end to end: one account, one email, however the request arrives.

use std::time::Duration;

use oncely_inbox::{Faults, Rejection};
use oncely_outbox::OnUnknown;
use oncely_testdb::TestDb;
use serde_json::{Value, json};

use crate::requests::{
    SENT_JOBS, USERS, VERIFIED_USERS, app_with_faults, expire_tokens, idempotent_post, nth_token,
    smtp_inbox, token, wait_for_count,
};
use crate::support::{
    TestApp, both_databases, count, dump, outbox_settled, spawn_app_on, spawn_app_with_inbox,
    spawn_binary, start_inbox, token_in,
};

fn signup_body(email: &str) -> Value {
    json!({ "email": email, "password": "correct horse battery" })
}

both_databases!(
    the_same_signup_retried_twenty_times_makes_one_user_and_one_email,
    fifty_concurrent_identical_signups_over_two_servers_and_two_workers_send_one_email,
    two_keys_for_the_same_new_address_make_one_account_and_the_same_answer,
    new_pending_and_registered_addresses_get_the_same_answer,
    bad_input_is_rejected_and_nothing_is_stored,
    the_server_killed_after_commit_replays_on_retry_and_one_email_arrives,
    a_worker_that_loses_the_answer_sends_one_email_to_a_deduplicating_provider,
    a_worker_that_loses_the_answer_over_plain_smtp_records_the_duplicate,
    a_worker_that_loses_the_answer_over_plain_smtp_reconciles_and_sends_one_email,
    three_rejections_then_delivered_with_four_attempts_and_a_permanent_one_is_dead,
    a_verification_link_works_once_and_its_token_is_in_no_log_and_no_column,
    an_expired_link_gets_the_same_generic_400_as_a_used_one,
    a_signup_wakes_the_workers_with_no_poll_to_fall_back_on,
);

/// The outbox wakes its workers when a signup's job commits: with an hour between polls, the
/// email still arrives (the wake-up once was server middleware, and a refactor dropped it
/// unnoticed while workers kept finding jobs at their 1 s poll).
async fn a_signup_wakes_the_workers_with_no_poll_to_fall_back_on(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |s| s.poll_interval = Duration::from_secs(3600)).await;
    // The first claim of the idle workers happens at start; these signups come after it.
    for (key, address) in [
        ("\"woken-1\"", "woken@example.com"),
        ("\"woken-2\"", "woken-2@example.com"),
    ] {
        let response = app.post("/v1/signup", key, &signup_body(address)).await;
        assert_eq!(response.status(), 202);
        let emails = app.emails_to(address, 1).await;
        assert_eq!(emails.len(), 1, "woken for {address}");
    }
}

async fn the_same_signup_retried_twenty_times_makes_one_user_and_one_email(
    url: String,
    _db: TestDb,
) {
    let app = spawn_app_on(&url, |_| {}).await;
    let mut bodies = Vec::new();
    for _ in 0..20 {
        let body = signup_body("Ada@Example.com");
        let response = app.post("/v1/signup", "\"signup-ada\"", &body).await;
        assert_eq!(response.status(), 202);
        bodies.push(response.text().await.unwrap());
    }
    assert!(bodies.iter().all(|b| b == &bodies[0]));
    assert_eq!(app.count(USERS).await, 1);
    let emails = app.emails_to("ada@example.com", 1).await;
    assert_eq!(emails.len(), 1, "exactly one email");
    assert_eq!(emails[0].subject, "Confirm your email address");
}

async fn fifty_concurrent_identical_signups_over_two_servers_and_two_workers_send_one_email(
    url: String,
    _db: TestDb,
) {
    let (inbox, running) = start_inbox(Faults::default()).await;
    let a = spawn_app_with_inbox(&url, inbox.clone(), running, |s| s.workers = 1).await;
    let b = spawn_app_with_inbox(&url, inbox.clone(), running, |s| s.workers = 1).await;
    let requests = (0..50).map(|i| {
        let server = if i % 2 == 0 { &a } else { &b };
        let request = idempotent_post(&server.client, &server.base, "/v1/signup", "storm-1")
            .json(&signup_body("storm@example.com"));
        tokio::spawn(async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        })
    });
    let mut answers = Vec::new();
    for r in requests {
        answers.push(r.await.unwrap());
    }
    assert!(answers.iter().all(|(s, _)| *s == 202), "{answers:?}");
    assert!(answers.iter().all(|(_, b)| b == &answers[0].1));
    assert_eq!(a.count(USERS).await, 1);
    assert_eq!(a.emails_to("storm@example.com", 1).await.len(), 1);
}

async fn two_keys_for_the_same_new_address_make_one_account_and_the_same_answer(
    url: String,
    _db: TestDb,
) {
    let app = spawn_app_on(&url, |_| {}).await;
    let body = signup_body("twice@example.com");
    let (first, second) = tokio::join!(
        app.post("/v1/signup", "key-one", &body),
        app.post("/v1/signup", "key-two", &body)
    );
    assert_eq!(
        (first.status(), second.status()),
        (202.try_into().unwrap(), 202.try_into().unwrap())
    );
    assert_eq!(first.text().await.unwrap(), second.text().await.unwrap());
    assert_eq!(app.count(USERS).await, 1);
}

async fn new_pending_and_registered_addresses_get_the_same_answer(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let body = signup_body("same@example.com");
    let new = app.post("/v1/signup", "a1", &body).await;
    app.inbox
        .wait_for("same@example.com", 1, Duration::from_secs(10))
        .await;
    let pending = app.post("/v1/signup", "a2", &body).await;
    // The second signup superseded the first link: only the newest one works.
    let newest = app
        .inbox
        .wait_for("same@example.com", 2, Duration::from_secs(10))
        .await;
    assert_eq!(newest.len(), 2, "a pending address gets a fresh link");
    let presented = token(&token_in(&newest[1]));
    assert_eq!(app.post("/v1/verify", "v1", &presented).await.status(), 200);
    let registered = app.post("/v1/signup", "a3", &body).await;
    let mut answers = Vec::new();
    for r in [new, pending, registered] {
        answers.push((r.status(), r.text().await.unwrap()));
    }
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    let emails = app.emails_to("same@example.com", 3).await;
    assert_eq!(emails.len(), 3);
    assert_eq!(
        emails[2].subject,
        "Someone tried to sign up with your address"
    );
    assert!(
        !emails[2].text.contains("token="),
        "the notice carries no link that changes anything"
    );
}

async fn bad_input_is_rejected_and_nothing_is_stored(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let json = Some("application/json");
    let cases: [(&str, Option<&str>, &str, u16); 5] = [
        ("bad-1", json, r#"{"email":"not-an-address"}"#, 400),
        (
            "bad-2",
            json,
            r#"{"email":"a@example.com","password":"short"}"#,
            400,
        ),
        (
            "bad-3",
            Some("text/plain"),
            r#"{"email":"a@example.com"}"#,
            415,
        ),
        (
            "bad-4",
            json,
            r#"{"email":"a@example.com","admin":true}"#,
            400,
        ),
        (
            "bad-5",
            json,
            &format!(
                r#"{{"email":"a@example.com","source":"{}"}}"#,
                "x".repeat(20_000)
            ),
            413,
        ),
    ];
    for (key, content_type, body, status) in cases {
        let mut request =
            idempotent_post(&app.client, &app.base, "/v1/signup", key).body(body.to_owned());
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), status, "{key}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{key}"
        );
    }
    assert_eq!(app.count(USERS).await, 0);
    assert_eq!(app.count("SELECT count(*) FROM oncely_outbox").await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_idempotency_keys")
            .await,
        0,
        "rejected keys stay free"
    );
}

async fn the_server_killed_after_commit_replays_on_retry_and_one_email_arrives(
    url: String,
    _db: TestDb,
) {
    let (inbox, mailer) = smtp_inbox().await;
    let crash = [("ONCELY_FAILPOINT", "crash-after-commit")];
    let doomed = spawn_binary(&url, &mailer, &["--workers", "0"], &crash).await;
    let client = oncely_testdb::http();
    let signup = |base: &str| {
        idempotent_post(&client, base, "/v1/signup", "crash-1")
            .json(&signup_body("crash@example.com"))
            .send()
    };
    let lost = signup(&doomed.base).await;
    assert!(lost.is_err(), "the process died before answering");
    let restarted = spawn_binary(&url, &mailer, &["--workers", "1"], &[]).await;
    let retry = signup(&restarted.base).await.unwrap();
    assert_eq!(retry.status(), 202);
    assert_eq!(
        retry.headers()["idempotent-replayed"],
        "true",
        "the committed result is replayed"
    );
    inbox
        .wait_for("crash@example.com", 1, Duration::from_secs(10))
        .await;
    outbox_settled(&url, Duration::from_secs(10)).await;
    assert_eq!(inbox.messages(Some("crash@example.com")).len(), 1);
    assert_eq!(count(&url, USERS).await, 1);
}

/// An app whose inbox (otherwise `faults`) drops the connection once, after accepting the
/// first email: the worker does not know whether it was sent. A signup for `email`, and then
/// the wait until its job counts as sent.
/// A signup whose email's answer is dropped after the inbox accepted it, the workers resending
/// unknown outcomes (`ONCELY_ON_UNKNOWN=resend`) or, `None`, by the default (over SMTP:
/// reconciling, with the inbox's lookup).
async fn a_signup_whose_answer_is_lost(
    url: &str,
    faults: Faults,
    email: &str,
    on_unknown: Option<OnUnknown>,
) -> TestApp {
    let faults = Faults {
        drop_after_accept: 1,
        ..faults
    };
    let (inbox, running) = start_inbox(faults).await;
    let app = spawn_app_with_inbox(url, inbox, running, |s| s.on_unknown = on_unknown).await;
    app.post("/v1/signup", "k", &signup_body(email)).await;
    wait_for_count(&app, SENT_JOBS, Duration::from_secs(10), |n| n >= 1).await;
    app
}

async fn a_worker_that_loses_the_answer_sends_one_email_to_a_deduplicating_provider(
    url: String,
    _db: TestDb,
) {
    // A provider that deduplicates by the key, over SMTP as Resend's does: resending is right.
    let provider = Faults::provider();
    let resend = Some(OnUnknown::Resend);
    let app = a_signup_whose_answer_is_lost(&url, provider, "drop@example.com", resend).await;
    assert_eq!(app.emails_to("drop@example.com", 1).await.len(), 1);
    assert_eq!(
        app.inbox.stats().deduplicated,
        1,
        "the retry reached the provider and was deduplicated"
    );
    assert_eq!(app.count(SENT_JOBS).await, 1);
}

async fn a_worker_that_loses_the_answer_over_plain_smtp_records_the_duplicate(
    url: String,
    _db: TestDb,
) {
    // Resending (not the default over SMTP) over a plain relay: the cost of it.
    let plain = Faults::default();
    let resend = Some(OnUnknown::Resend);
    let app = a_signup_whose_answer_is_lost(&url, plain, "plain@example.com", resend).await;
    assert_eq!(
        app.emails_to("plain@example.com", 2).await.len(),
        2,
        "plain SMTP cannot deduplicate"
    );
    assert_eq!(app.inbox.stats().duplicates, 1);
    let unknown = app
        .count("SELECT count(*) FROM oncely_outbox_attempts WHERE result = 'unknown'")
        .await;
    assert_eq!(unknown, 1, "the attempt history shows why");
}

async fn a_worker_that_loses_the_answer_over_plain_smtp_reconciles_and_sends_one_email(
    url: String,
    _db: TestDb,
) {
    // The default over SMTP: the job parks, the worker asks the inbox whether it accepted the
    // delivery key, and records it sent without a second copy.
    let plain = Faults::default();
    let app = a_signup_whose_answer_is_lost(&url, plain, "once@example.com", None).await;
    assert_eq!(app.emails_to("once@example.com", 1).await.len(), 1);
    outbox_settled(&url, Duration::from_secs(10)).await;
    assert_eq!(app.inbox.messages(Some("once@example.com")).len(), 1);
    assert_eq!(app.inbox.stats().duplicates, 0);
    let settled = "SELECT count(*) FROM oncely_outbox_attempts
                    WHERE result = 'sent' AND error LIKE 'not run: settled as sent%'";
    assert_eq!(app.count(settled).await, 1, "recorded sent without a run");
}

async fn three_rejections_then_delivered_with_four_attempts_and_a_permanent_one_is_dead(
    url: String,
    _db: TestDb,
) {
    let faults = Faults {
        reject_next: 3,
        ..Faults::default()
    };
    let app = app_with_faults(&url, faults).await;
    app.post("/v1/signup", "k1", &signup_body("retry@example.com"))
        .await;
    assert_eq!(app.emails_to("retry@example.com", 1).await.len(), 1);
    let attempts = app.count("SELECT count(*) FROM oncely_outbox_attempts");
    assert_eq!(attempts.await, 4);
    // The inbox's temporary rejection is SMTP 451: throttling, no attempt of the budget spent.
    let throttled = "SELECT count(*) FROM oncely_outbox_attempts WHERE result = 'throttled'";
    assert_eq!(app.count(throttled).await, 3);

    app.inbox.set_faults(Faults {
        reject_next: 1,
        rejection: Rejection::Permanent,
        ..Faults::default()
    });
    app.post("/v1/signup", "k2", &signup_body("dead@example.com"))
        .await;
    let dead = "SELECT count(*) FROM oncely_outbox WHERE status = 'dead'";
    wait_for_count(&app, dead, Duration::from_secs(10), |n| n > 0).await;
    let reason = app
        .count(
            "SELECT count(*) FROM oncely_outbox WHERE status = 'dead' AND last_error LIKE '%550%'",
        )
        .await;
    assert_eq!(reason, 1, "dead, with the provider's reason");
    assert!(app.inbox.messages(Some("dead@example.com")).is_empty());
}

async fn a_verification_link_works_once_and_its_token_is_in_no_log_and_no_column(
    url: String,
    _db: TestDb,
) {
    let (inbox, mailer) = smtp_inbox().await;
    let mut process = spawn_binary(&url, &mailer, &[], &[]).await;
    let client = oncely_testdb::http();
    let post = |path: &str, key: &str, body: Value| {
        idempotent_post(&client, &process.base, path, key)
            .json(&body)
            .send()
    };
    post("/v1/signup", "s", signup_body("once@example.com"))
        .await
        .unwrap();
    let email = inbox
        .wait_for("once@example.com", 1, Duration::from_secs(10))
        .await
        .remove(0);
    let token = token_in(&email);
    assert!(token.len() >= 43, "≥ 256 bits, base64url");
    let page = client
        .get(format!("{}/v1/verify?token={token}", process.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200, "opening the link consumes nothing");
    // The page holds a live token: not cached, not sent on as a Referer, its one script allowed
    // by the response's nonce (issue 15, item 6).
    let header = |name: &str| {
        page.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(header("cache-control"), "no-store");
    assert_eq!(header("referrer-policy"), "no-referrer");
    let policy = header("content-security-policy");
    let nonce = policy
        .split("'nonce-")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap_or_else(|| panic!("no nonce: {policy}"))
        .to_owned();
    assert!(policy.contains("default-src 'none'"), "{policy}");
    let html = page.text().await.unwrap();
    assert!(
        html.contains(&format!("<script nonce=\"{nonce}\">")),
        "{html}"
    );
    // A repeated token parameter gets the page too (it was a text/plain 400).
    let twice = client
        .get(format!("{}/v1/verify?token={token}&token=x", process.base))
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), 200);
    assert!(twice.text().await.unwrap().contains("{token: \"\"}"));
    let first = post("/v1/verify", "v1", json!({ "token": token }));
    assert_eq!(first.await.unwrap().status(), 200);
    let again = post("/v1/verify", "v2", json!({ "token": token }))
        .await
        .unwrap();
    assert_eq!(again.status(), 400);
    assert_eq!(
        again.json::<Value>().await.unwrap()["type"],
        "https://oncely.dev/problems/token-invalid"
    );
    assert_eq!(count(&url, VERIFIED_USERS).await, 1);

    let database = dump(&url).await;
    assert!(
        database.contains("once@example.com"),
        "the dump really covers the tables"
    );
    assert!(
        !database.contains(&token),
        "the raw token is in no database column"
    );
    process.child.kill().await.unwrap();
    let logs = process.stderr.await.unwrap();
    assert!(
        logs.contains("signup accepted"),
        "the log really was captured"
    );
    assert!(!logs.contains(&token), "the raw token is in no log line");
    assert!(
        !logs.contains("once@example.com"),
        "full addresses are in no log line"
    );
}

/// API processes with no workers, and a separate `oncely worker` process, coordinating only
/// through PostgreSQL (LISTEN/NOTIFY across processes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_api_process_and_a_separate_worker_process_deliver_one_email() {
    let (url, _db) = crate::support::postgres_db().await;
    let (inbox, mailer) = smtp_inbox().await;
    let api = spawn_binary(&url, &mailer, &["--workers", "0"], &[]).await;
    let _worker = crate::support::spawn_worker(&url, &mailer).await;
    let client = oncely_testdb::http();
    let response = idempotent_post(&client, &api.base, "/v1/signup", "split-1")
        .json(&signup_body("split@example.com"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    assert_eq!(
        inbox
            .wait_for("split@example.com", 1, Duration::from_secs(10))
            .await
            .len(),
        1
    );
}

async fn an_expired_link_gets_the_same_generic_400_as_a_used_one(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    app.post("/v1/signup", "s", &signup_body("late@example.com"))
        .await;
    let presented = token(&nth_token(&app, "late@example.com", 1).await);
    // 25 hours later (the link lives 24 h): age the token in place.
    expire_tokens(&url, "verification").await;
    let expired = app.post("/v1/verify", "v1", &presented).await;
    assert_eq!(expired.status(), 400);
    let expired: Value = expired.json().await.unwrap();
    let unknown = app.post("/v1/verify", "v2", &token("not-a-token")).await;
    let unknown: Value = unknown.json().await.unwrap();
    assert_eq!(
        expired, unknown,
        "expired and unknown tokens are indistinguishable"
    );
    assert_eq!(count(&url, VERIFIED_USERS).await, 0);
}

/// A signup whose address another transaction holds (an uncommitted insert of the same
/// account) past the request's lock timeout is a 503 `storage-unavailable` with `Retry-After`
/// — the database cannot serve it now — not a 500; nothing of it stays, and the same request
/// retried once the other transaction is gone makes the account and sends its email.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signup_that_waits_past_the_lock_timeout_for_its_address_is_a_503_then_retries() {
    use sqlx::Connection;

    let (url, _db) = crate::support::postgres_db().await;
    let app = spawn_app_on(&url, |_| {}).await;
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut held = holder.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO oncely_users (id, tenant, email) VALUES (gen_random_uuid(), 'default', 'held@example.com')",
    )
    .execute(&mut *held)
    .await
    .unwrap();
    let body = signup_body("held@example.com");
    let waited = app.post("/v1/signup", "held-key", &body).await;
    assert_eq!(waited.status(), 503);
    assert_eq!(
        waited
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    let problem: Value = waited.json().await.unwrap();
    assert_eq!(
        problem["type"], "https://oncely.dev/problems/storage-unavailable",
        "{problem}"
    );
    held.rollback().await.unwrap();
    assert_eq!(app.count(USERS).await, 0);
    let retried = app.post("/v1/signup", "held-key", &body).await;
    assert_eq!(retried.status(), 202);
    assert_eq!(app.count(USERS).await, 1);
    assert_eq!(app.emails_to("held@example.com", 1).await.len(), 1);
}
