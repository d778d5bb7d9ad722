//! Every account flow: one email per logical request, tokens that work once in their own
//! flow and tenant, answers that do not reveal whether an address has an account, and caps on
//! email that hold whether or not it does.

use std::time::{Duration, Instant};

use oncely_testdb::TestDb;
use serde_json::{Value, json};

use crate::requests::{
    ACME_MEMBERSHIPS, ACME_VERIFIED_USERS, CAPPED_BY_CLIENT, PENDING_JOBS, USERS,
    app_with_mail_caps, assert_counts, email, expire_tokens, idempotent_post, nth_token, sign_up,
    token, wait_for_count,
};
use crate::support::{TestApp, both_databases, token_in};

/// An app whose address cap does not get in the way of the flow being tested.
async fn app(url: &str) -> TestApp {
    app_with_mail_caps(url, 100, 1000, |_| {}).await
}

/// A verified account (signup, then its link), its inbox emptied.
async fn verified_user(app: &TestApp, address: &str) {
    let signup_key = format!("signup-{address}");
    sign_up(app, &signup_key, address).await;
    let presented = token(&nth_token(app, address, 1).await);
    let verify = app
        .post("/v1/verify", &format!("verify-{address}"), &presented)
        .await;
    assert_eq!(verify.status(), 200);
    app.inbox.clear();
}

/// Sends the same request `n` times in a row, then `n` times at once, with one key each time.
/// The second logical request waits for the first one's email: its new link supersedes the
/// first, and a superseded link still unsent is (rightly) never sent.
async fn retried_and_concurrent(app: &TestApp, path: &str, body: &Value, n: usize) {
    let retried = format!("{path}-retried");
    for _ in 0..n {
        assert_eq!(app.post(path, &retried, body).await.status(), 202);
    }
    let to = body["email"].as_str().expect("a request naming an address");
    app.inbox
        .wait_for(to, 1, std::time::Duration::from_secs(10))
        .await;
    let concurrent = format!("{path}-concurrent");
    let at_once =
        futures::future::join_all((0..n).map(|_| app.post(path, &concurrent, body))).await;
    for response in at_once {
        assert_eq!(response.status(), 202);
    }
}

both_databases!(
    each_link_flow_sends_exactly_one_email_per_logical_request,
    a_reset_token_sets_the_password_once_and_expires,
    a_magic_link_signs_in_once_and_fails_generically_after_expiry,
    invites_need_an_api_key_and_accepting_twice_makes_one_membership,
    a_bad_api_key_is_401_and_never_falls_back_to_the_default_tenant,
    a_token_of_tenant_a_is_useless_for_tenant_b,
    existing_and_unknown_addresses_get_identical_answers_and_the_same_database_work,
    per_address_caps_hold_whether_or_not_the_address_exists,
    per_client_caps_stop_mail_from_one_client,
);

async fn each_link_flow_sends_exactly_one_email_per_logical_request(url: String, _db: TestDb) {
    let app = app(&url).await;
    // Resend needs an unverified account.
    let pending = "pending@example.com";
    app.post("/v1/signup", "s", &email(pending)).await;
    app.emails_to(pending, 1).await;
    app.inbox.clear();
    retried_and_concurrent(&app, "/v1/verification/resend", &email(pending), 20).await;
    let resent = app.emails_to(pending, 2).await;
    assert_eq!(
        resent.len(),
        2,
        "one per logical request (retried, concurrent)"
    );

    verified_user(&app, "ada@example.com").await;
    for (path, subject) in [
        ("/v1/password-reset", "Reset your password"),
        ("/v1/magic-link", "Your sign-in link"),
    ] {
        retried_and_concurrent(&app, path, &email("ada@example.com"), 20).await;
        let emails = app.emails_to("ada@example.com", 2).await;
        assert_eq!(emails.len(), 2, "{path}: one email per logical request");
        assert!(emails.iter().all(|e| e.subject == subject));
        app.inbox.clear();
    }
}

async fn a_reset_token_sets_the_password_once_and_expires(url: String, _db: TestDb) {
    let app = app(&url).await;
    let user = "reset@example.com";
    verified_user(&app, user).await;
    app.post("/v1/password-reset", "r1", &email(user)).await;
    let token = nth_token(&app, user, 1).await;
    let page = app
        .get(&format!("/v1/password-reset/confirm?token={token}"))
        .await;
    assert_eq!(page.status(), 200, "opening the link consumes nothing");
    let confirm = "/v1/password-reset/confirm";
    let short = json!({ "token": token, "password": "short" });
    assert_eq!(
        app.post(confirm, "c0", &short).await.status(),
        400,
        "a bad password is refused before the token is used"
    );
    let body = json!({ "token": token, "password": "a brand new password" });
    let changed = app.post(confirm, "c1", &body).await;
    assert_eq!(changed.status(), 200);
    assert_eq!(
        changed.json::<Value>().await.unwrap()["status"],
        "password_changed"
    );
    let argon2id = "SELECT count(*) FROM oncely_users WHERE password_hash LIKE '$argon2id$%'";
    assert_counts(&app, &[(argon2id, 1)]).await;
    let replay = app.post(confirm, "c1", &body).await;
    assert_eq!(replay.status(), 200, "a retry with the same key replays");
    let again = app.post(confirm, "c2", &body).await;
    assert_eq!(again.status(), 400, "the token works once");

    app.post("/v1/password-reset", "r2", &email(user)).await;
    let token = nth_token(&app, user, 2).await;
    expire_tokens(&url, "password_reset").await;
    let late = json!({ "token": token, "password": "another new one" });
    let late = app.post(confirm, "c3", &late).await;
    assert_eq!(late.status(), 400, "an expired reset link fails");
}

async fn a_magic_link_signs_in_once_and_fails_generically_after_expiry(url: String, _db: TestDb) {
    let app = app(&url).await;
    let user = "magic@example.com";
    verified_user(&app, user).await;
    let consume = "/v1/magic-link/consume";
    app.post("/v1/magic-link", "m1", &email(user)).await;
    let presented = token(&nth_token(&app, user, 1).await);
    let first = app.post(consume, "u1", &presented).await;
    assert_eq!(first.json::<Value>().await.unwrap()["status"], "signed_in");
    assert_eq!(app.post(consume, "u2", &presented).await.status(), 400);

    app.post("/v1/magic-link", "m2", &email(user)).await;
    let presented = token(&nth_token(&app, user, 2).await);
    expire_tokens(&url, "magic_link").await;
    let expired: Value = app
        .post(consume, "u3", &presented)
        .await
        .json()
        .await
        .unwrap();
    let unknown = app.post(consume, "u4", &token("nope")).await;
    let unknown: Value = unknown.json().await.unwrap();
    assert_eq!(expired, unknown, "expired and unknown links fail alike");
    // A token of one flow is useless in another.
    app.post("/v1/magic-link", "m3", &email(user)).await;
    let presented = token(&nth_token(&app, user, 3).await);
    assert_eq!(app.post("/v1/verify", "x", &presented).await.status(), 400);
}

async fn invites_need_an_api_key_and_accepting_twice_makes_one_membership(
    url: String,
    _db: TestDb,
) {
    let app = app(&url).await;
    let guest = "guest@example.com";
    let anonymous = app.post("/v1/invites", "i0", &email(guest)).await;
    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    let key = app.create_tenant("acme").await;
    assert!(key.starts_with("onc_"));
    let tenants = "SELECT count(*) FROM oncely_tenants WHERE id = 'acme'";
    assert_counts(&app, &[(tenants, 1)]).await;
    for _ in 0..20 {
        let invited = app.post_as(&key, "/v1/invites", "i1", &email(guest)).await;
        assert_eq!(invited.status(), 202);
    }
    let invite = &app.emails_to(guest, 1).await;
    assert_eq!(invite.len(), 1, "one email for twenty retries");
    // It says what one is invited to join: the tenant, on this service.
    let host = app.base.trim_start_matches("http://");
    let what = format!("join acme on {host}");
    assert_eq!(invite[0].subject, format!("You are invited to {what}"));
    assert!(invite[0].text.contains(&what), "{}", invite[0].text);
    let accept = json!({ "token": token_in(&invite[0]), "password": "guest password" });
    let path = "/v1/invites/accept";
    assert_eq!(app.post_as(&key, path, "a1", &accept).await.status(), 200);
    assert_eq!(
        app.post_as(&key, path, "a2", &accept).await.status(),
        400,
        "the token works once"
    );
    // A second invite to the same address, accepted: still one account, one membership.
    app.post_as(&key, "/v1/invites", "i2", &email(guest)).await;
    let second = token(&nth_token(&app, guest, 2).await);
    assert_eq!(app.post_as(&key, path, "a3", &second).await.status(), 200);
    assert_counts(&app, &[(ACME_MEMBERSHIPS, 1), (ACME_VERIFIED_USERS, 1)]).await;
}

async fn a_bad_api_key_is_401_and_never_falls_back_to_the_default_tenant(url: String, _db: TestDb) {
    let app = app(&url).await;
    let body = email("x@example.com");
    for key in ["onc_not-a-real-key", "garbage"] {
        let response = app.post_as(key, "/v1/signup", "k", &body).await;
        assert_eq!(response.status(), 401, "{key}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
    }
    let basic = idempotent_post(&app.client, &app.base, "/v1/signup", "k")
        .header("authorization", "Basic dTpw")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), 401);
    assert_eq!(
        app.count(USERS).await,
        0,
        "nothing ran as the default tenant"
    );
}

async fn a_token_of_tenant_a_is_useless_for_tenant_b(url: String, _db: TestDb) {
    let app = app(&url).await;
    let a = app.create_tenant("tenant-a").await;
    let b = app.create_tenant("tenant-b").await;
    let both = "both@example.com";
    app.post_as(&a, "/v1/signup", "same-key", &email(both))
        .await;
    let presented = token(&nth_token(&app, both, 1).await);
    // The same key in tenant B is another request: not a replay of A's.
    let in_b = app
        .post_as(&b, "/v1/signup", "same-key", &email(both))
        .await;
    assert!(in_b.headers().get("idempotent-replayed").is_none());
    let users = "SELECT count(*) FROM oncely_users WHERE email = 'both@example.com'";
    assert_counts(&app, &[(users, 2)]).await;
    assert_eq!(app.status_as(&b, "/v1/verify", "v", &presented).await, 400);
    // A browser has no API key: the token names its tenant, so the owner's click works
    // (this test used to assert a 400 here — every non-default tenant's links were broken).
    assert_eq!(
        app.post("/v1/verify", "v0", &presented).await.status(),
        200,
        "the owner's click from a browser, without an API key"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_users WHERE email = 'both@example.com' AND status = 'verified' AND tenant = 'tenant-a'")
            .await,
        1,
        "verified in its own tenant, not in b"
    );
    assert_eq!(
        app.status_as(&a, "/v1/verify", "v", &presented).await,
        400,
        "and only once"
    );
}

/// Rows per table, to compare the database work of two requests. (Rate-limit counters are
/// one upsert in every case; whether it inserts or updates depends on earlier mail to that
/// address in the window, not on whether it has an account, so they are not compared.)
async fn row_counts(app: &TestApp) -> Vec<i64> {
    let mut counts = Vec::new();
    for table in ["oncely_tokens", "oncely_outbox", "oncely_idempotency_keys"] {
        counts.push(app.count(&format!("SELECT count(*) FROM {table}")).await);
    }
    counts
}

fn comparable(response: &reqwest::Response) -> Vec<(String, String)> {
    let mut headers: Vec<_> = response
        .headers()
        .iter()
        // The date and the request id differ between any two responses.
        .filter(|(name, _)| *name != "date" && *name != "x-request-id")
        .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
        .collect();
    headers.sort();
    headers
}

async fn existing_and_unknown_addresses_get_identical_answers_and_the_same_database_work(
    url: String,
    _db: TestDb,
) {
    let app = app(&url).await;
    verified_user(&app, "known@example.com").await;
    app.post("/v1/signup", "p", &email("pending@example.com"))
        .await;
    // Signup last: it creates the unknown address's account.
    for path in [
        "/v1/verification/resend",
        "/v1/password-reset",
        "/v1/magic-link",
        "/v1/signup",
    ] {
        let known_address = if path == "/v1/verification/resend" {
            "pending@example.com"
        } else {
            "known@example.com"
        };
        let before = row_counts(&app).await;
        let known_key = format!("{path}-known");
        let known = app.post(path, &known_key, &email(known_address)).await;
        let middle = row_counts(&app).await;
        let unknown_key = format!("{path}-unknown");
        let unknown = app
            .post(path, &unknown_key, &email("nobody@example.com"))
            .await;
        let after = row_counts(&app).await;
        assert_eq!(known.status(), unknown.status(), "{path}");
        assert_eq!(comparable(&known), comparable(&unknown), "{path}: headers");
        assert_eq!(
            known.text().await.unwrap(),
            unknown.text().await.unwrap(),
            "{path}: body"
        );
        if path != "/v1/signup" {
            // Signup creates the unknown address's account; the others write the same rows.
            let delta =
                |a: &[i64], b: &[i64]| a.iter().zip(b).map(|(x, y)| y - x).collect::<Vec<_>>();
            assert_eq!(
                delta(&before, &middle),
                delta(&middle, &after),
                "{path}: rows written"
            );
        }
    }
    let to_nobody = app.emails_to("nobody@example.com", 1).await;
    assert_eq!(
        to_nobody.len(),
        1,
        "an unknown address gets mail only from its signup"
    );
    assert_eq!(to_nobody[0].subject, "Confirm your email address");

    // Timing: the same request for a known and an unknown address, interleaved; the two
    // response-time samples must not differ systematically (Mann-Whitney U, |z| < 4).
    let (mut known, mut unknown) = (Vec::new(), Vec::new());
    for i in 0..40 {
        for (address, sample) in [
            ("known@example.com", &mut known),
            ("nobody-else@example.com", &mut unknown),
        ] {
            let key = format!("t-{address}-{i}");
            let started = Instant::now();
            let r = app.post("/v1/password-reset", &key, &email(address)).await;
            assert_eq!(r.status(), 202);
            sample.push(started.elapsed());
        }
    }
    let z = mann_whitney_z(&known, &unknown);
    assert!(
        z.abs() < 4.0,
        "response times differ systematically (z = {z:.2}): known {:?} vs unknown {:?}",
        median(&known),
        median(&unknown)
    );
}

pub fn median(sample: &[Duration]) -> Duration {
    let mut sorted = sample.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

/// The normal approximation of the Mann-Whitney U statistic (ties counted half).
pub fn mann_whitney_z(a: &[Duration], b: &[Duration]) -> f64 {
    let u: f64 = a
        .iter()
        .map(|x| {
            b.iter()
                .map(|y| {
                    if x > y {
                        1.0
                    } else if x == y {
                        0.5
                    } else {
                        0.0
                    }
                })
                .sum::<f64>()
        })
        .sum();
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    let mean = n1 * n2 / 2.0;
    let sd = (n1 * n2 * (n1 + n2 + 1.0) / 12.0).sqrt();
    (u - mean) / sd
}

#[test]
fn mann_whitney_tells_shifted_samples_apart() {
    let a: Vec<_> = (0..40)
        .map(|i| Duration::from_micros(1000 + i * 10))
        .collect();
    let b: Vec<_> = (0..40)
        .map(|i| Duration::from_micros(1300 + i * 10))
        .collect();
    assert!(mann_whitney_z(&a, &b) < -4.0);
    let c: Vec<_> = (0..40)
        .map(|i| Duration::from_micros(1000 + (i * 7919 % 400)))
        .collect();
    let d: Vec<_> = (0..40)
        .map(|i| Duration::from_micros(1000 + (i * 104729 % 400)))
        .collect();
    assert!(mann_whitney_z(&c, &d).abs() < 4.0);
}

async fn per_address_caps_hold_whether_or_not_the_address_exists(url: String, _db: TestDb) {
    let app = app_with_mail_caps(&url, 2, 1000, |_| {}).await;
    app.post("/v1/signup", "s", &email("capped@example.com"))
        .await; // email 1 of 2
    app.emails_to("capped@example.com", 1).await;
    let mut answers = Vec::new();
    for i in 0..4 {
        for address in ["capped@example.com", "ghost@example.com"] {
            let key = format!("r{i}-{address}");
            let r = app.post("/v1/password-reset", &key, &email(address)).await;
            answers.push((r.status(), r.text().await.unwrap()));
        }
    }
    assert!(
        answers.iter().all(|a| a == &answers[0]),
        "the cap never changes the answer"
    );
    let emails = app.emails_to("capped@example.com", 3).await;
    assert_eq!(emails.len(), 2, "signup + one reset, then the cap");
    let suppressed = app
        .count("SELECT count(*) FROM oncely_outbox_attempts WHERE result = 'skipped' AND error LIKE 'suppressed: over 2 emails%to this address'")
        .await;
    assert_eq!(
        suppressed,
        3 + 2,
        "visible in the attempt history: 3 for the account, 2 for the unknown address"
    );
}

async fn per_client_caps_stop_mail_from_one_client(url: String, _db: TestDb) {
    let app = app_with_mail_caps(&url, 100, 3, |_| {}).await;
    for i in 0..5 {
        let (key, address) = (format!("s{i}"), format!("user{i}@example.com"));
        sign_up(&app, &key, &address).await;
    }
    wait_for_count(&app, PENDING_JOBS, Duration::from_secs(10), |n| n == 0).await;
    assert_eq!(app.inbox.messages(None).len(), 3);
    assert_eq!(app.count(CAPPED_BY_CLIENT).await, 2);
    // Counted in the process: no row that every request of the client would update.
    let client_rows = "SELECT COUNT(*) FROM oncely_rate_limits WHERE bucket LIKE 'client:%'";
    assert_eq!(app.count(client_rows).await, 0);
    let address_rows = "SELECT COUNT(*) FROM oncely_rate_limits WHERE bucket LIKE 'address%'";
    assert!(
        app.count(address_rows).await >= 5,
        "the per-address caps stay rows"
    );
}
