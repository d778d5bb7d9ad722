//! Email events (issue 17, items 2 and 4): `email.sent` and `email.failed` follow an email job's
//! final status (one event id per email, however many attempts it took; none for a decoy or a
//! capped email), and a tenant whose email delivery is `webhook` gets each email as one signed
//! `email.requested` event — its link derived at delivery, never stored, never logged — and no
//! mail.

use std::time::{Duration, Instant};

use oncely_inbox::{Faults, Rejection, Verification, Webhook};
use oncely_server::accounts::{Accounts, NewEndpoint};
use oncely_server::backend::{Postgres, Sqlite};
use oncely_server::secret::signing::{SigningSecret, seal};
use oncely_server::token::{Flow, Token};
use oncely_testdb::TestDb;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::requests::{click, email, nth_link};
use crate::support::{
    Logs, SECRET, TestApp, both_databases, capture_logs, dump, execute, oncely_binary,
    open_backend, run_to_end, secret, spawn_app_with_inbox, start_inbox, texts,
};

const PASSWORD: &str = "correct horse battery";

/// Polls `probe` until it answers `Some` (bounded: 30 s).
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut probe: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// An endpoint of `tenant` at `address` receiving `events`, sealed with the app's secret;
/// returns its signing secret.
async fn endpoint(url: &str, tenant: &str, address: &str, events: &str) -> SigningSecret {
    let id = Uuid::new_v4();
    let signing = SigningSecret::generate();
    let sealed = seal(&secret(SECRET), id, &signing);
    let endpoint = NewEndpoint {
        id,
        tenant,
        url: address,
        events,
        secret_sealed: &sealed,
    };
    if url.starts_with("postgres") {
        let backend = open_backend::<Postgres>(url).await;
        backend.insert_webhook_endpoint(endpoint).await.unwrap();
    } else {
        let backend = open_backend::<Sqlite>(url).await;
        backend.insert_webhook_endpoint(endpoint).await.unwrap();
    }
    signing
}

/// The payloads of the webhook jobs of events of `kind`.
async fn deliveries(url: &str, kind: &str) -> Vec<Value> {
    let sql = if url.starts_with("postgres") {
        "SELECT payload::text FROM oncely_outbox WHERE kind = 'webhook' ORDER BY id"
    } else {
        "SELECT payload FROM oncely_outbox WHERE kind = 'webhook' ORDER BY id"
    };
    texts(url, sql)
        .await
        .into_iter()
        .map(|p| serde_json::from_str::<Value>(&p).unwrap())
        .filter(|p| p["type"] == kind)
        .collect()
}

/// The event data of `kind`'s deliveries, by event id (each event's deliveries carry one body).
async fn events(url: &str, kind: &str) -> std::collections::BTreeMap<String, Value> {
    let mut by_id = std::collections::BTreeMap::new();
    for payload in deliveries(url, kind).await {
        let body: Value = serde_json::from_str(payload["body"].as_str().unwrap()).unwrap();
        let id = payload["event_id"].as_str().unwrap().to_owned();
        if let Some(seen) = by_id.insert(id, body["data"].clone()) {
            assert_eq!(seen, body["data"], "one body per event");
        }
    }
    by_id
}

/// The delivery key and final status of the email jobs of `kind` (`email.verification`…).
async fn email_jobs(url: &str, kind: &str) -> Vec<(Uuid, String)> {
    let sql = format!(
        "SELECT {} || ' ' || status FROM oncely_outbox WHERE kind = '{kind}' ORDER BY id",
        uuid_text(url, "delivery_key")
    );
    texts(url, &sql)
        .await
        .into_iter()
        .map(|row| {
            let (key, status) = row.split_once(' ').unwrap();
            (key.parse().unwrap(), status.to_owned())
        })
        .collect()
}

/// A uuid column as text (SQLite stores them as blobs).
fn uuid_text(url: &str, column: &str) -> String {
    if url.starts_with("postgres") {
        format!("{column}::text")
    } else {
        format!("hex({column})")
    }
}

/// A uuid in event data.
fn uuid_in(value: &Value) -> Uuid {
    value.as_str().unwrap().parse().unwrap()
}

/// An app mailing to an inbox with `faults`, a tenant `acme` (its key) and its endpoint at the
/// inbox's `/webhooks/acme` receiving `events`; the inbox knows the endpoint's secret.
async fn world(url: &str, faults: Faults, events: &str) -> (TestApp, String, SigningSecret) {
    let (inbox, running) = start_inbox(faults).await;
    let hook = format!("http://{}/webhooks/acme", running.http_addr);
    let app = spawn_app_with_inbox(url, inbox, running, |s| {
        crate::support::mail_caps(s, 1000, 10_000);
    })
    .await;
    let key = app.create_tenant("acme").await;
    let signing = endpoint(url, "acme", &hook, events).await;
    app.inbox
        .set_webhook_secrets("acme", [signing.expose()])
        .unwrap();
    (app, key, signing)
}

async fn signup(app: &TestApp, key: &str, address: &str, idempotency_key: &str) -> u16 {
    let mut body = email(address);
    body["password"] = json!(PASSWORD);
    app.post_as(key, "/v1/signup", idempotency_key, &body)
        .await
        .status()
        .as_u16()
}

both_databases!(
    email_sent_follows_an_email_once_even_when_the_provider_rejected_its_first_attempts,
    email_failed_says_why_an_email_went_dead,
    a_decoy_or_a_capped_email_has_no_event,
    email_delivery_webhook_is_refused_without_an_endpoint_that_receives_email_requested,
);

async fn email_sent_follows_an_email_once_even_when_the_provider_rejected_its_first_attempts(
    url: String,
    _db: TestDb,
) {
    let faults = Faults {
        reject_next: 2,
        ..Faults::default()
    };
    let (app, key, _) = world(&url, faults, r#"["email.sent","email.failed"]"#).await;
    assert_eq!(signup(&app, &key, "ada@example.com", "s-1").await, 202);
    let link = nth_link(&app, "ada@example.com", 1).await;
    let (status, answer) = click(&app, &link, Some(PASSWORD)).await;
    assert_eq!(status, 200, "{answer}");
    // A second signup of the (verified) address: a notice to the account (its tenant in the
    // payload); its decoy link is skipped.
    assert_eq!(signup(&app, &key, "ada@example.com", "s-2").await, 202);
    let sent = eventually("two email.sent events", || async {
        let sent = events(&url, "email.sent").await;
        (sent.len() >= 2).then_some(sent)
    })
    .await;
    assert_eq!(sent.len(), 2, "{sent:?}");
    let verification = email_jobs(&url, "email.verification").await;
    let notice = email_jobs(&url, "email.signup_notice").await;
    assert_eq!(verification.len(), 2, "the signup's and the decoy's");
    assert_eq!(notice.len(), 1);
    let user = texts(
        &url,
        &format!(
            "SELECT {} FROM oncely_users WHERE email = 'ada@example.com'",
            uuid_text(&url, "id")
        ),
    )
    .await;
    let user: Uuid = user[0].parse().unwrap();
    for (template, (delivery_key, status)) in [
        ("verification", &verification[0]),
        ("signup_notice", &notice[0]),
    ] {
        assert_eq!(status, "sent");
        let data = sent
            .values()
            .find(|d| d["template"] == template)
            .unwrap_or_else(|| panic!("an email.sent of {template}: {sent:?}"));
        assert_eq!(uuid_in(&data["email_id"]), *delivery_key, "{data}");
        assert_eq!(data["to"], "a***@example.com");
        assert_eq!(uuid_in(&data["user_id"]), user, "{data}");
        assert!(data["provider_message_id"].is_string(), "{data}");
        assert!(!data.to_string().contains("ada@"), "masked: {data}");
    }
    // Two rejected attempts, one event: the retries wrote no other.
    assert_eq!(app.inbox.stats().rejected, 2);
    assert!(events(&url, "email.failed").await.is_empty());
    // Delivered to the endpoint, once per event id, signed with its secret.
    let received: Vec<Webhook> = eventually("both delivered", || async {
        let got = app.inbox.webhooks(Some("acme"), Some("email.sent"));
        (got.len() >= 2).then_some(got)
    })
    .await;
    let ids: std::collections::BTreeSet<_> = received
        .iter()
        .filter_map(|w| w.webhook_id.clone())
        .collect();
    assert_eq!(ids, sent.keys().cloned().collect());
    assert!(received.iter().all(|w| w.verdict == Verification::Verified));
}

async fn email_failed_says_why_an_email_went_dead(url: String, _db: TestDb) {
    let faults = Faults {
        reject_next: 1,
        rejection: Rejection::Permanent,
        ..Faults::default()
    };
    let (app, key, _) = world(&url, faults, "[]").await;
    assert_eq!(signup(&app, &key, "bob@example.com", "s-1").await, 202);
    let failed = eventually("an email.failed event", || async {
        let failed = events(&url, "email.failed").await;
        (!failed.is_empty()).then_some(failed)
    })
    .await;
    assert_eq!(failed.len(), 1);
    let data = failed.values().next().unwrap();
    let jobs = email_jobs(&url, "email.verification").await;
    assert_eq!(jobs[0].1, "dead");
    assert_eq!(uuid_in(&data["email_id"]), jobs[0].0);
    assert_eq!(data["template"], "verification");
    assert_eq!(data["to"], "b***@example.com");
    assert!(data["reason"].as_str().unwrap().contains("550"), "{data}");
    assert!(events(&url, "email.sent").await.is_empty());
}

async fn a_decoy_or_a_capped_email_has_no_event(url: String, _db: TestDb) {
    let (inbox, running) = start_inbox(Faults::default()).await;
    let hook = format!("http://{}/webhooks/acme", running.http_addr);
    // One email per address per window.
    let app = spawn_app_with_inbox(&url, inbox, running, |s| {
        crate::support::mail_caps(s, 1, 10_000);
        s.limits.per_address_total = 1;
    })
    .await;
    let key = app.create_tenant("acme").await;
    endpoint(&url, "acme", &hook, "[]").await;
    // A reset for an address with no account: a decoy job, skipped.
    let reset = app
        .post_as(
            &key,
            "/v1/password-reset",
            "r-1",
            &email("nobody@example.com"),
        )
        .await;
    assert_eq!(reset.status(), 202);
    // Signups of one address: past the cap, their emails are suppressed, skipped.
    for i in 1..=4 {
        let status = signup(&app, &key, "cap@example.com", &format!("s-{i}")).await;
        assert_eq!(status, 202, "a capped signup answers as any");
    }
    let ended =
        "SELECT COUNT(*) FROM oncely_outbox WHERE kind LIKE 'email.%' AND status <> 'pending'";
    let all = "SELECT COUNT(*) FROM oncely_outbox WHERE kind LIKE 'email.%'";
    eventually("every email job ended", || async {
        let (ended, all) = (app.count(ended).await, app.count(all).await);
        (ended == all && all == 5).then_some(())
    })
    .await;
    let reset = email_jobs(&url, "email.password_reset").await;
    assert_eq!(reset.len(), 1);
    assert_eq!(reset[0].1, "skipped", "the decoy");
    let verification = email_jobs(&url, "email.verification").await;
    let capped: Vec<Uuid> = verification
        .iter()
        .filter(|(_, status)| status == "skipped")
        .map(|(key, _)| *key)
        .collect();
    let sent: Vec<Uuid> = verification
        .iter()
        .filter(|(_, status)| status == "sent")
        .map(|(key, _)| *key)
        .collect();
    assert!(
        !capped.is_empty(),
        "some signup was capped: {verification:?}"
    );
    assert_eq!(capped.len() + sent.len(), 4, "{verification:?}");
    let payloads = texts(
        &url,
        &format!(
            "SELECT {} FROM oncely_outbox WHERE kind = 'email.verification' AND status = 'skipped'",
            if url.starts_with("postgres") {
                "payload::text"
            } else {
                "payload"
            }
        ),
    )
    .await;
    assert!(
        payloads.iter().all(|p| p.contains("over ")),
        "skipped for the cap: {payloads:?}"
    );
    // An email.sent per email sent, none for the skipped ones; no email.failed.
    let sent_events = events(&url, "email.sent").await;
    let mut reported: Vec<Uuid> = sent_events
        .values()
        .map(|d| uuid_in(&d["email_id"]))
        .collect();
    reported.sort();
    let mut expected = sent.clone();
    expected.sort();
    assert_eq!(reported, expected, "{sent_events:?}");
    assert!(sent_events.values().all(|d| d["to"] == "c***@example.com"));
    assert!(events(&url, "email.failed").await.is_empty());
}

/// `oncely tenant …` on the database: exit code, stdout, stderr.
async fn oncely(url: &str, args: &[&str]) -> (i32, String, String) {
    run_to_end(oncely_binary(args).args(["--database-url", url])).await
}

async fn email_delivery_webhook_is_refused_without_an_endpoint_that_receives_email_requested(
    url: String,
    _db: TestDb,
) {
    crate::support::migrate(&url).await;
    let (code, ..) = oncely(&url, &["tenant", "create", "acme"]).await;
    assert_eq!(code, 0);
    let set = ["tenant", "set", "acme", "--email-delivery", "webhook"];
    let (code, out, err) = oncely(&url, &set).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("email.requested"), "{err}");
    // An endpoint of other events, a disabled one, another tenant's: still refused.
    oncely(&url, &["tenant", "create", "other"]).await;
    endpoint(
        &url,
        "acme",
        "https://a.example/hook",
        r#"["user.created"]"#,
    )
    .await;
    endpoint(&url, "acme", "https://off.example/hook", "[]").await;
    execute(
        &url,
        "UPDATE oncely_webhook_endpoints SET disabled_at = created_at WHERE url = 'https://off.example/hook'",
    )
    .await;
    endpoint(&url, "other", "https://other.example/hook", "[]").await;
    let (code, out, err) = oncely(&url, &set).await;
    assert_eq!(code, 1, "{out}{err}");
    let listed = |out: String| -> String {
        let tenants: Value = serde_json::from_str(&out).unwrap();
        tenants
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tenant"] == "acme")
            .unwrap()["email_delivery"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (_, out, _) = oncely(&url, &["tenant", "list", "--json"]).await;
    assert_eq!(listed(out), "mail");
    // One that receives it explicitly: accepted, with the return URLs in the same command.
    endpoint(
        &url,
        "acme",
        "https://b.example/hook",
        r#"["email.requested"]"#,
    )
    .await;
    let with_urls = [
        "tenant",
        "set",
        "acme",
        "--email-delivery",
        "webhook",
        "--return-url",
        "https://app.example.com/cb",
        "--json",
    ];
    let (code, out, err) = oncely(&url, &with_urls).await;
    assert_eq!(code, 0, "{out}{err}");
    let answer: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["email_delivery"], "webhook");
    assert_eq!(answer["return_urls"], json!(["https://app.example.com/cb"]));
    let (_, out, _) = oncely(&url, &["tenant", "list", "--json"]).await;
    assert_eq!(listed(out), "webhook");
    let (_, out, _) = oncely(&url, &["tenant", "list"]).await;
    assert!(out.contains("webhook"), "{out}");
    // Back to mail, alone: always allowed; the return URLs stay.
    let (code, ..) = oncely(&url, &["tenant", "set", "acme", "--email-delivery", "mail"]).await;
    assert_eq!(code, 0);
    let (_, out, _) = oncely(&url, &["tenant", "list", "--json"]).await;
    assert_eq!(listed(out.clone()), "mail");
    assert!(out.contains("https://app.example.com/cb"), "{out}");
    // An unknown tenant: not found.
    let (code, ..) = oncely(&url, &["tenant", "set", "nope", "--email-delivery", "mail"]).await;
    assert_eq!(code, 3);
}

// ---------------------------------------------------------------------------------------------
// Emails delivered by webhook: one thread (the app's tasks log to this test's subscriber).

/// Both databases in one test, one after the other under one log subscriber: two tests each
/// with its own thread's subscriber, running at once, lose each other's callsites' interest.
#[tokio::test]
async fn by_webhook_on_both_databases() {
    let (logs, _guard) = capture_logs();
    let (url, _db) = crate::support::postgres_db().await;
    email_requested_once_verified_by_its_link_and_stored_nowhere(&url, &logs).await;
    logs.0.lock().unwrap().clear();
    let (url, _db) = crate::support::sqlite_db().await;
    email_requested_once_verified_by_its_link_and_stored_nowhere(&url, &logs).await;
}

mod by_webhook_used_first {
    #[tokio::test]
    async fn postgres() {
        let (url, _db) = crate::support::postgres_db().await;
        super::a_link_used_before_its_delivery_is_not_delivered(&url).await;
    }
    #[tokio::test]
    async fn sqlite() {
        let (url, _db) = crate::support::sqlite_db().await;
        super::a_link_used_before_its_delivery_is_not_delivered(&url).await;
    }
}

/// `world` with the tenant's emails delivered by webhook (the endpoint receives every event).
async fn webhook_world(url: &str, faults: Faults) -> (TestApp, String, SigningSecret) {
    let (app, key, signing) = world(url, faults, "[]").await;
    let (code, out, err) = oncely(
        url,
        &["tenant", "set", "acme", "--email-delivery", "webhook"],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    (app, key, signing)
}

async fn email_requested_once_verified_by_its_link_and_stored_nowhere(url: &str, logs: &Logs) {
    let (app, key, signing) = webhook_world(url, Faults::default()).await;
    let address = "ada@example.com";
    // 20 retries of one request, then 20 concurrent ones with its key.
    for _ in 0..20 {
        assert_eq!(signup(&app, &key, address, "one-signup").await, 202);
    }
    let concurrent = (0..20).map(|_| signup(&app, &key, address, "one-signup"));
    for status in futures::future::join_all(concurrent).await {
        assert!([202, 409].contains(&status), "{status}");
    }
    let delivered: Webhook = eventually("the email.requested delivery", || async {
        app.inbox
            .webhooks(Some("acme"), Some("email.requested"))
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(delivered.verdict, Verification::Verified, "{delivered:?}");
    // Every webhook job is done: nothing more will come.
    let pending = "SELECT COUNT(*) FROM oncely_outbox WHERE status = 'pending'";
    eventually("the outbox drained", || async {
        (app.count(pending).await == 0).then_some(())
    })
    .await;
    let requested = app.inbox.webhooks(Some("acme"), Some("email.requested"));
    let ids: std::collections::BTreeSet<_> = requested
        .iter()
        .filter_map(|w| w.webhook_id.clone())
        .collect();
    assert_eq!(ids.len(), 1, "one email.requested event id: {requested:?}");
    assert!(
        app.inbox
            .webhooks(Some("acme"), Some("email.sent"))
            .is_empty(),
        "no email.sent for an email handed over"
    );
    let jobs = email_jobs(url, "email.verification").await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].1, "sent");
    let body: Value = serde_json::from_str(&delivered.body).unwrap();
    let data = &body["data"];
    assert_eq!(uuid_in(&data["email_id"]), jobs[0].0);
    assert_eq!(data["template"], "verification");
    assert_eq!(
        data["to"], address,
        "the full recipient: the application sends it"
    );
    assert_eq!(data["subject"], "Confirm your email address");
    assert!(data["from"].is_string());
    assert_eq!(
        data["reply_to"],
        Value::Null,
        "no support address configured"
    );
    let link = data["link"].as_str().unwrap().to_owned();
    assert!(link.contains("?token="), "{link}");
    assert!(data["text"].as_str().unwrap().contains(&link), "{data}");
    // The HTML part too (issue 18), with the same link where the template puts it.
    let html = data["html"].as_str().expect("an HTML part");
    assert!(html.contains(&format!("href=\"{link}\"")), "{html}");
    let token = link.split("token=").nth(1).unwrap().to_owned();
    // No mail.
    assert!(app.inbox.messages(None).is_empty(), "oncely mailed nothing");
    // Verified by another implementation: the reference package.
    reference_verifies(&signing, &delivered);
    // The token is stored nowhere and logged nowhere.
    let stored = dump(url).await;
    assert!(!stored.contains(&token), "the token is in the database");
    let logged = logs.text();
    // The app's tasks log to this thread's subscriber; when other tests run at once in this
    // process, tracing's per-callsite interest can miss it (the check then says so and is
    // skipped: run this test alone, `cargo test --test it by_webhook_on`, for the log check).
    if !logged.contains("webhook attempt") {
        println!(
            "SKIPPED: the log check ({url}): the app's log was not captured by this test's subscriber"
        );
    }
    assert!(!logged.contains(&token), "the token is in the log");
    // The link works: it verifies the account.
    let (status, answer) = click(&app, &link, Some(PASSWORD)).await;
    assert_eq!(status, 200, "{answer}");
    let verified = app
        .count("SELECT COUNT(*) FROM oncely_users WHERE email = 'ada@example.com' AND status = 'verified'")
        .await;
    assert_eq!(verified, 1);
}

async fn a_link_used_before_its_delivery_is_not_delivered(url: &str) {
    // The endpoint refuses the first deliveries: the link is used meanwhile.
    let faults = Faults {
        webhook_reject_next: 1_000,
        ..Faults::default()
    };
    let (app, key, _) = webhook_world(url, faults).await;
    assert_eq!(signup(&app, &key, "eve@example.com", "s-1").await, 202);
    // The email.requested delivery itself refused (not only the user.created one): the
    // email was handed over while the link was live.
    let attempted = "SELECT COUNT(*) FROM oncely_outbox WHERE kind = 'webhook' AND attempts >= 1
                        AND CAST(payload AS TEXT) LIKE '%email.requested%'";
    eventually("a refused email.requested delivery", || async {
        (app.count(attempted).await >= 1).then_some(())
    })
    .await;
    // The token, derived as the server derives it (the test knows the secret), used.
    let sql = format!(
        "SELECT {} FROM oncely_tokens WHERE flow = 'verification'",
        uuid_text(url, "id")
    );
    let token_id: Uuid = texts(url, &sql).await[0].parse().unwrap();
    let token = Token::derive(&secret(SECRET), Flow::Verification, token_id);
    let link = format!(
        "{}{}?token={}",
        app.base,
        Flow::Verification.path(),
        token.expose()
    );
    let (status, answer) = click(&app, &link, Some(PASSWORD)).await;
    assert_eq!(status, 200, "{answer}");
    // An attempt that began before the click checked the link while it was live, and a
    // delivery already on its way cannot be called back: the faults are cleared only once every
    // attempt open at the click has ended (refused). An attempt not yet visible here was
    // claimed after the click committed, so it checks the link after the use.
    let open = "SELECT CAST(id AS TEXT) FROM oncely_outbox_attempts WHERE finished_at IS NULL";
    let open_at_click = texts(url, open).await;
    eventually("the attempts open at the click ended", || {
        let open_at_click = open_at_click.clone();
        async move {
            let still = texts(url, open).await;
            (!still.iter().any(|id| open_at_click.contains(id))).then_some(())
        }
    })
    .await;
    app.inbox.set_faults(Faults::default());
    // Due now (not after its backoff) — unless it is claimed: a claimed job's `run_after` is
    // its lease, and making it due would let another claim take it over. `lease_token` is on
    // the row itself, so a claim that commits while this update waits for the row is seen
    // (a condition on another table would be read from the update's older snapshot).
    let due_now = if url.starts_with("postgres") {
        "UPDATE oncely_outbox SET run_after = now() WHERE kind = 'webhook' AND status = 'pending' AND lease_token IS NULL"
    } else {
        "UPDATE oncely_outbox SET run_after = 0 WHERE kind = 'webhook' AND status = 'pending' AND lease_token IS NULL"
    };
    let skipped =
        "SELECT COUNT(*) FROM oncely_outbox WHERE kind = 'webhook' AND status = 'skipped'";
    // Made due again on every probe: an attempt refused before the faults were cleared may end
    // after an update, putting the job back behind its backoff.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        execute(url, due_now).await;
        if app.count(skipped).await == 1 {
            break;
        }
        if Instant::now() > deadline {
            let jobs = "SELECT substr(CAST(payload AS TEXT), 1, 60) || ' ' || status
                               || ' attempts ' || CAST(attempts AS TEXT) || ' run_after '
                               || CAST(run_after AS TEXT) || ' ' || COALESCE(last_error, '')
                          FROM oncely_outbox WHERE kind = 'webhook'";
            let attempts = "SELECT CAST(attempt AS TEXT) || ' ' || COALESCE(result, 'open')
                              FROM oncely_outbox_attempts";
            let (jobs, attempts) = (texts(url, jobs).await, texts(url, attempts).await);
            panic!("the delivery was not skipped: jobs {jobs:?}, attempts {attempts:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        app.inbox
            .webhooks(Some("acme"), Some("email.requested"))
            .is_empty(),
        "a used link is never delivered"
    );
}

/// `scripts/standardwebhooks-check.py verify` (the reference package) accepts `delivered`;
/// skipped visibly when the package is missing.
fn reference_verifies(signing: &SigningSecret, delivered: &Webhook) {
    use std::io::Write;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/standardwebhooks-check.py"
    );
    let item = json!({
        "secret": signing.expose(),
        "headers": {
            "webhook-id": delivered.webhook_id,
            "webhook-timestamp": delivered.timestamp,
            "webhook-signature": delivered.signature,
        },
        "body": delivered.body,
    });
    let mut child = std::process::Command::new("python3")
        .args([script, "verify"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{item}").unwrap();
    let output = child.wait_with_output().unwrap();
    if output.status.code() == Some(3) {
        println!(
            "SKIPPED: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        return;
    }
    assert!(output.status.success(), "{output:?}");
    let said: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        said,
        json!({ "ok": true }),
        "the reference package said {said}"
    );
}
