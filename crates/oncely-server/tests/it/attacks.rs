//! The attacker's side of every account flow (DESIGN.md, threat model), walked the way real
//! callers walk them: the application's backend with its tenant's API key, and the address
//! owner's browser — the GET page from the email, then the POST its button sends, with no API
//! key — on a tenant other than the default.

use argon2::{PasswordHash, PasswordVerifier};
use oncely_inbox::Message;
use oncely_testdb::TestDb;
use serde_json::{Value, json};

use oncely_server::settings::{Environment, Settings};

use crate::support::{
    SECRET, TestApp, both_databases, execute, mail_caps, secret, spawn_app_on,
    spawn_app_with_inbox, start_inbox, token_in,
};

both_databases!(
    a_pre_registered_password_is_never_adopted_by_the_owner,
    the_signups_own_password_is_adopted_when_re_entered,
    verifying_by_another_link_ends_signup_links_and_adopts_no_password,
    a_strangers_signup_does_not_cancel_the_owners_link,
    an_invite_to_a_pre_registered_address_sets_the_invitees_password,
    every_link_of_a_non_default_tenant_works_from_a_browser,
    a_tenants_link_is_useless_with_another_tenants_api_key,
    a_secret_rotation_keeps_retries_links_and_queued_emails_working,
    the_same_key_with_another_query_is_refused_not_replayed,
    a_password_an_older_release_left_on_a_pending_account_is_never_adopted,
    a_strangers_resend_does_not_cancel_the_owners_signup_link,
    a_stranger_cannot_use_up_the_owners_emails,
    whoever_sees_a_link_cannot_guess_the_signup_password_online,
);

/// `/metrics` counts emails sent and skipped by kind: from outside, a before/after scrape
/// around a reset request would tell a registered address from an unknown one.
#[tokio::test]
async fn metrics_are_not_an_enumeration_oracle_in_production() {
    let (url, _db) = crate::support::sqlite_db().await;
    let production = |settings: &mut Settings| {
        settings.environment = Environment::Production;
        settings.public_url = Some("https://accounts.example.com".into());
    };
    let app = spawn_app_on(&url, production).await;
    // Without a token: nobody (behind a local proxy every peer is 127.0.0.1).
    assert_eq!(metrics_status(&app, "127.0.0.2", None).await, 404);
    assert_eq!(metrics_status(&app, "127.0.0.1", None).await, 404);
    let token = "metrics-token-0123456789";
    let with_token = |settings: &mut Settings| {
        production(settings);
        settings.metrics_token = Some(token.into());
    };
    let app = spawn_app_on(&url, with_token).await;
    assert_eq!(metrics_status(&app, "127.0.0.2", None).await, 404);
    let wrong = Some("metrics-token-0123456788");
    assert_eq!(metrics_status(&app, "127.0.0.2", wrong).await, 404);
    assert_eq!(
        metrics_status(&app, "127.0.0.2", Some(token)).await,
        200,
        "the bearer of the token, from anywhere"
    );
}

async fn metrics_status(app: &TestApp, source: &str, token: Option<&str>) -> u16 {
    let mut req = from(source).get(format!("{}/metrics", app.base));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send().await.unwrap().status().as_u16()
}

/// The link in an email (`http…?token=…`).
fn link_in(message: &Message) -> String {
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
/// sends — the token the page embeds, to the path the page posts to, with the page's own
/// Idempotency-Key — adding `password` where the page has a password field.
async fn click(app: &TestApp, link: &str, password: Option<&str>) -> (u16, Value) {
    let page = app.client.get(link).send().await.unwrap();
    assert_eq!(page.status(), 200, "the page opens without an API key");
    let html = page.text().await.unwrap();
    let action = between(&html, "fetch(\"", "\"");
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
    let answer = app
        .client
        .post(format!("{}{action}", app.base))
        .header("idempotency-key", uuid::Uuid::new_v4().to_string())
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text.find(start).expect("marker in the page") + start.len();
    let to = text[from..].find(end).expect("end marker") + from;
    &text[from..to]
}

async fn password_hash_of(app: &TestApp, email: &str) -> Option<String> {
    let sql = format!("SELECT password_hash FROM oncely_users WHERE email = '{email}'");
    if app.database_url.starts_with("postgres") {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&app.database_url)
            .await
            .unwrap();
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut conn)
            .await
            .unwrap()
    } else {
        let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&app.database_url)
            .await
            .unwrap();
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut conn)
            .await
            .unwrap()
    }
}

fn verifies(phc: &str, password: &str) -> bool {
    let parsed = PasswordHash::new(phc).unwrap();
    argon2::Argon2::default()
        .verify_password(password.as_bytes(), &parsed)
        .is_ok()
}

fn problem_type(body: &Value) -> &str {
    body["type"]
        .as_str()
        .unwrap_or_default()
        .rsplit('/')
        .next()
        .unwrap()
}

async fn a_pre_registered_password_is_never_adopted_by_the_owner(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let victim = "victim@example.com";
    // The attacker signs up with the victim's address and a password of its own.
    let attack = json!({ "email": victim, "password": "attacker password" });
    assert_eq!(
        app.post("/v1/signup", "attack", &attack).await.status(),
        202
    );
    assert_eq!(
        password_hash_of(&app, victim).await,
        None,
        "a pending account holds no password"
    );
    let link = link_in(&app.emails_to(victim, 1).await[0]);
    // The owner, who never chose that password, cannot adopt it by typing its own …
    let (status, body) = click(&app, &link, Some("owner password")).await;
    assert_eq!((status, problem_type(&body)), (400, "password-mismatch"));
    // … and confirming without one verifies the address and leaves no password to sign in with.
    let (status, body) = click(&app, &link, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({ "status": "verified", "password_set": false }));
    assert_eq!(password_hash_of(&app, victim).await, None);
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_users WHERE status = 'verified'")
            .await,
        1
    );
}

async fn the_signups_own_password_is_adopted_when_re_entered(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let owner = "owner@example.com";
    let signup = json!({ "email": owner, "password": "owner password" });
    assert_eq!(app.post("/v1/signup", "s1", &signup).await.status(), 202);
    let link = link_in(&app.emails_to(owner, 1).await[0]);
    let (status, body) = click(&app, &link, Some("owner password")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({ "status": "verified", "password_set": true }));
    let phc = password_hash_of(&app, owner).await.expect("a password");
    assert!(verifies(&phc, "owner password"));
    assert!(!verifies(&phc, "attacker password"));
}

async fn verifying_by_another_link_ends_signup_links_and_adopts_no_password(
    url: String,
    _db: TestDb,
) {
    let app = spawn_app_on(&url, |_| {}).await;
    let victim = "magic-victim@example.com";
    let attack = json!({ "email": victim, "password": "attacker password" });
    app.post("/v1/signup", "attack", &attack).await;
    let signup_link = link_in(&app.emails_to(victim, 1).await[0]);
    // The owner signs in with a magic link: the address is proven, no password is adopted.
    app.post("/v1/magic-link", "m1", &json!({ "email": victim }))
        .await;
    let magic_link = link_in(&app.emails_to(victim, 2).await[1]);
    let (status, body) = click(&app, &magic_link, None).await;
    assert_eq!((status, &body["status"]), (200, &json!("signed_in")));
    assert_eq!(password_hash_of(&app, victim).await, None);
    // The signup link that carried the stranger's password no longer works, with or without it.
    let (status, body) = click(&app, &signup_link, Some("attacker password")).await;
    assert_eq!((status, problem_type(&body)), (400, "token-invalid"));
    let (status, _) = click(&app, &signup_link, None).await;
    assert_eq!(status, 400);
    assert_eq!(password_hash_of(&app, victim).await, None);
}

async fn a_strangers_signup_does_not_cancel_the_owners_link(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let owner = "raced@example.com";
    let mine = json!({ "email": owner, "password": "owner password" });
    app.post("/v1/signup", "mine", &mine).await;
    let my_link = link_in(&app.emails_to(owner, 1).await[0]);
    let theirs = json!({ "email": owner, "password": "attacker password" });
    app.post("/v1/signup", "theirs", &theirs).await;
    let their_link = link_in(&app.emails_to(owner, 2).await[1]);
    assert_ne!(my_link, their_link);
    let (status, body) = click(&app, &my_link, Some("owner password")).await;
    assert_eq!(status, 200, "the owner's own link still works: {body}");
    assert_eq!(body["password_set"], true);
    // Verified: the stranger's link is over.
    let (status, _) = click(&app, &their_link, Some("attacker password")).await;
    assert_eq!(status, 400);
    let phc = password_hash_of(&app, owner).await.unwrap();
    assert!(verifies(&phc, "owner password"));
}

async fn an_invite_to_a_pre_registered_address_sets_the_invitees_password(
    url: String,
    _db: TestDb,
) {
    let app = spawn_app_on(&url, |_| {}).await;
    let key = app.create_tenant("acme").await;
    let guest = "pre-registered-guest@example.com";
    // The attacker pre-registers the address in the tenant the invitation will come from.
    let attack = json!({ "email": guest, "password": "attacker password" });
    app.post_as(&key, "/v1/signup", "attack", &attack).await;
    let signup_link = link_in(&app.emails_to(guest, 1).await[0]);
    app.post_as(&key, "/v1/invites", "invite", &json!({ "email": guest }))
        .await;
    let invite_link = link_in(&app.emails_to(guest, 2).await[1]);
    let (status, body) = click(&app, &invite_link, Some("guest password")).await;
    assert_eq!((status, &body["status"]), (200, &json!("joined")), "{body}");
    let phc = password_hash_of(&app, guest).await.unwrap();
    assert!(verifies(&phc, "guest password"));
    let (status, _) = click(&app, &signup_link, Some("attacker password")).await;
    assert_eq!(
        status, 400,
        "the pre-registration's link ended with the invite"
    );
    assert!(verifies(
        &password_hash_of(&app, guest).await.unwrap(),
        "guest password"
    ));
}

async fn every_link_of_a_non_default_tenant_works_from_a_browser(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let key = app.create_tenant("acme").await;
    // The application's backend asks for every kind of email, with its tenant's key.
    let user = "acme-user@example.com";
    let signup = json!({ "email": user, "password": "user password" });
    assert_eq!(
        app.post_as(&key, "/v1/signup", "s", &signup).await.status(),
        202
    );
    let (status, body) = click(
        &app,
        &link_in(&app.emails_to(user, 1).await[0]),
        Some("user password"),
    )
    .await;
    assert_eq!(status, 200, "verification link: {body}");
    assert_eq!(body["password_set"], true);
    let email = json!({ "email": user });
    app.post_as(&key, "/v1/password-reset", "r", &email).await;
    let (status, body) = click(
        &app,
        &link_in(&app.emails_to(user, 2).await[1]),
        Some("a new password"),
    )
    .await;
    assert_eq!(status, 200, "reset link: {body}");
    assert!(verifies(
        &password_hash_of(&app, user).await.unwrap(),
        "a new password"
    ));
    app.post_as(&key, "/v1/magic-link", "m", &email).await;
    let (status, body) = click(&app, &link_in(&app.emails_to(user, 3).await[2]), None).await;
    assert_eq!(status, 200, "magic link: {body}");
    let guest = "acme-guest@example.com";
    app.post_as(&key, "/v1/invites", "i", &json!({ "email": guest }))
        .await;
    let (status, body) = click(&app, &link_in(&app.emails_to(guest, 1).await[0]), None).await;
    assert_eq!(status, 200, "invite link: {body}");
    // Everything happened in the tenant, nothing in the default one.
    assert_eq!(
        app.count(
            "SELECT count(*) FROM oncely_users WHERE tenant = 'acme' AND status = 'verified'"
        )
        .await,
        2
    );
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_memberships WHERE tenant = 'acme'")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_users WHERE tenant <> 'acme'")
            .await,
        0
    );
}

async fn a_tenants_link_is_useless_with_another_tenants_api_key(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let acme = app.create_tenant("acme").await;
    let globex = app.create_tenant("globex").await;
    let user = "shared@example.com";
    app.post_as(&acme, "/v1/signup", "s", &json!({ "email": user }))
        .await;
    let token = token_in(&app.emails_to(user, 1).await[0]);
    // Tenant B's backend presents tenant A's token: one generic answer, nothing used.
    let answer = app
        .post_as(
            &globex,
            "/v1/verify",
            "v-globex",
            &json!({ "token": token }),
        )
        .await;
    assert_eq!(answer.status(), 400);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(problem_type(&body), "token-invalid");
    // … and the same invitation flow: acme's invite cannot be accepted into globex.
    app.post_as(
        &acme,
        "/v1/invites",
        "i",
        &json!({ "email": "guest@example.com" }),
    )
    .await;
    let invite = token_in(&app.emails_to("guest@example.com", 1).await[0]);
    let answer = app
        .post_as(
            &globex,
            "/v1/invites/accept",
            "a-globex",
            &json!({ "token": invite }),
        )
        .await;
    assert_eq!(answer.status(), 400);
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_memberships").await,
        0
    );
    // The owner's own click (no API key) still works: the link was not used up.
    let answer = app
        .post("/v1/verify", "v-owner", &json!({ "token": token }))
        .await;
    assert_eq!(answer.status(), 200);
    let answer = app
        .post_as(
            &acme,
            "/v1/invites/accept",
            "a-acme",
            &json!({ "token": invite }),
        )
        .await;
    assert_eq!(answer.status(), 200);
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_memberships WHERE tenant = 'acme'")
            .await,
        1
    );
}

async fn a_secret_rotation_keeps_retries_links_and_queued_emails_working(url: String, _db: TestDb) {
    const NEXT: &str = "the-next-server-secret-0123456789-abcdef";
    // Before the rotation: an API process without workers, so the email job waits in the outbox.
    let (inbox, running) = start_inbox(oncely_inbox::Faults::default()).await;
    let before = spawn_app_with_inbox(&url, inbox.clone(), running, |s| s.workers = 0).await;
    let owner = "rotated@example.com";
    let signup = json!({ "email": owner, "password": "owner password" });
    let first = before.post("/v1/signup", "rotation", &signup).await;
    assert_eq!(first.status(), 202);
    let first_body = first.text().await.unwrap();

    // After it: ONCELY_SECRET is new, the old one is ONCELY_SECRET_PREVIOUS.
    let after = spawn_app_on(&url, |s| {
        s.secret = secret(NEXT).with_previous(vec![secret(SECRET)]);
    })
    .await;
    let retry = after.post("/v1/signup", "rotation", &signup).await;
    assert_eq!(retry.status(), 202, "a retry across the rotation replays");
    assert_eq!(
        retry
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(retry.text().await.unwrap(), first_body);
    // The queued email, sent after the rotation, carries the link whose hash is stored.
    let link = link_in(&after.emails_to(owner, 1).await[0]);
    let (status, body) = click(&after, &link, Some("owner password")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["password_set"], true);
    assert_eq!(
        after
            .count("SELECT count(*) FROM oncely_outbox WHERE status = 'sent'")
            .await,
        1
    );

    // Without the previous secret, the same retry is another request (what the ring prevents).
    let forgotten = spawn_app_on(&url, |s| s.secret = secret(NEXT)).await;
    let lost = forgotten.post("/v1/signup", "rotation", &signup).await;
    assert_eq!(lost.status(), 422);
}

async fn the_same_key_with_another_query_is_refused_not_replayed(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let body = json!({ "email": "query@example.com" });
    let post = |path: &'static str| {
        let app = &app;
        let body = &body;
        async move {
            app.client
                .post(format!("{}{path}", app.base))
                .header("idempotency-key", "one-key")
                .json(body)
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(post("/v1/signup?ref=a").await.status(), 202);
    let replay = post("/v1/signup?ref=a").await;
    assert!(replay.headers().get("idempotent-replayed").is_some());
    let other = post("/v1/signup?ref=b").await;
    assert_eq!(other.status(), 422, "another query is another request");
    assert_eq!(post("/v1/signup").await.status(), 422);
}

/// The release before migration 0004 wrote a signup's password on the pending account, and a
/// process of that release may still serve beside this one after `oncely migrate`: whatever a
/// pending account holds is never what the owner's proof of the address adopts.
async fn a_password_an_older_release_left_on_a_pending_account_is_never_adopted(
    url: String,
    _db: TestDb,
) {
    let app = spawn_app_on(&url, |_| {}).await;
    let key = app.create_tenant("acme").await;
    let attacker_hash = crate::support::argon2_hash("attacker password");
    let plant = |email: &str| {
        format!("UPDATE oncely_users SET password_hash = '{attacker_hash}' WHERE email = '{email}'")
    };
    // Verification without a password.
    let by_verify = "old-verify@example.com";
    app.post_as(&key, "/v1/signup", "s1", &json!({ "email": by_verify }))
        .await;
    let link = link_in(&app.emails_to(by_verify, 1).await[0]);
    execute(&url, &plant(by_verify)).await;
    let (status, body) = click(&app, &link, None).await;
    assert_eq!((status, &body["password_set"]), (200, &json!(false)));
    assert_eq!(password_hash_of(&app, by_verify).await, None);
    // A magic link.
    let by_magic = "old-magic@example.com";
    app.post_as(&key, "/v1/signup", "s2", &json!({ "email": by_magic }))
        .await;
    app.emails_to(by_magic, 1).await;
    execute(&url, &plant(by_magic)).await;
    app.post_as(&key, "/v1/magic-link", "m2", &json!({ "email": by_magic }))
        .await;
    let (status, _) = click(&app, &link_in(&app.emails_to(by_magic, 2).await[1]), None).await;
    assert_eq!(status, 200);
    assert_eq!(password_hash_of(&app, by_magic).await, None);
    // An invitation: the invitee's password, or none — never the planted one.
    for (email, password) in [
        ("old-invite@example.com", Some("guest password")),
        ("old-invite-nopw@example.com", None),
    ] {
        app.post_as(
            &key,
            "/v1/signup",
            &format!("s3-{email}"),
            &json!({ "email": email }),
        )
        .await;
        app.emails_to(email, 1).await;
        execute(&url, &plant(email)).await;
        app.post_as(
            &key,
            "/v1/invites",
            &format!("i3-{email}"),
            &json!({ "email": email }),
        )
        .await;
        let (status, body) =
            click(&app, &link_in(&app.emails_to(email, 2).await[1]), password).await;
        assert_eq!(status, 200, "{body}");
        match password {
            Some(password) => assert!(verifies(
                &password_hash_of(&app, email).await.unwrap(),
                password
            )),
            None => assert_eq!(password_hash_of(&app, email).await, None),
        }
    }
    // A reset sets the new password (and only it).
    let by_reset = "old-reset@example.com";
    app.post_as(&key, "/v1/signup", "s4", &json!({ "email": by_reset }))
        .await;
    app.emails_to(by_reset, 1).await;
    execute(&url, &plant(by_reset)).await;
    app.post_as(
        &key,
        "/v1/password-reset",
        "r4",
        &json!({ "email": by_reset }),
    )
    .await;
    let (status, _) = click(
        &app,
        &link_in(&app.emails_to(by_reset, 2).await[1]),
        Some("owner's new password"),
    )
    .await;
    assert_eq!(status, 200);
    let phc = password_hash_of(&app, by_reset).await.unwrap();
    assert!(verifies(&phc, "owner's new password"));
}

async fn a_strangers_resend_does_not_cancel_the_owners_signup_link(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let owner = "resent@example.com";
    let signup = json!({ "email": owner, "password": "owner password" });
    app.post("/v1/signup", "mine", &signup).await;
    let my_link = link_in(&app.emails_to(owner, 1).await[0]);
    // Anyone may ask for a resend (no API key on the default tenant).
    app.post(
        "/v1/verification/resend",
        "theirs",
        &json!({ "email": owner }),
    )
    .await;
    let resent = link_in(&app.emails_to(owner, 2).await[1]);
    // The resent link carries no password: re-entering one there says so …
    let (status, body) = click(&app, &resent, Some("owner password")).await;
    assert_eq!((status, problem_type(&body)), (400, "invalid-request"));
    // … and the owner's own signup link still sets the owner's password.
    let (status, body) = click(&app, &my_link, Some("owner password")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["password_set"], true);
    assert!(verifies(
        &password_hash_of(&app, owner).await.unwrap(),
        "owner password"
    ));
}

fn from(source: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(source.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap()
}

async fn post_from(app: &TestApp, client: &reqwest::Client, path: &str, key: &str, body: &Value) {
    let answer = client
        .post(format!("{}{path}", app.base))
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
}

/// The per-address cap is per client: a stranger who asks for the owner's emails until the cap
/// is reached uses up only its own share; the owner, from another address, still gets its
/// reset link. Many clients together meet the total ceiling.
async fn a_stranger_cannot_use_up_the_owners_emails(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |s| {
        mail_caps(s, 2, 1000);
        s.limits.per_address_total = 6;
    })
    .await;
    let owner = "capped-owner@example.com";
    let (stranger, owner_client) = (from("127.0.0.2"), from("127.0.0.3"));
    post_from(
        &app,
        &owner_client,
        "/v1/signup",
        "own",
        &json!({ "email": owner }),
    )
    .await;
    // The stranger asks for the owner's reset link ten times: 2 pass, 8 are suppressed, and
    // only the 2 count toward the mailbox's total.
    for i in 0..10 {
        let body = json!({ "email": owner });
        post_from(
            &app,
            &stranger,
            "/v1/password-reset",
            &format!("x{i}"),
            &body,
        )
        .await;
    }
    let suppressed = |pattern: &'static str| {
        let app = &app;
        async move {
            app.count(&format!(
                "SELECT count(*) FROM oncely_outbox WHERE CAST(payload AS TEXT) LIKE '%suppressed: over%{pattern}%'"
            ))
            .await
        }
    };
    assert_eq!(suppressed("to this address\"").await, 8);
    // The owner, from its own address, still gets a reset link, and it works.
    post_from(
        &app,
        &owner_client,
        "/v1/password-reset",
        "mine",
        &json!({ "email": owner }),
    )
    .await;
    assert_eq!(suppressed("to this address\"").await, 8, "not the owner's");
    drained(&app).await;
    // Its link is the live one (it superseded the stranger's): one of the emails opens it.
    let mut status = 0;
    for email in app.inbox.messages(Some(owner)).iter().rev() {
        if email.text.contains("/v1/password-reset/confirm") {
            status = click(&app, &link_in(email), Some("owner's new password"))
                .await
                .0;
            if status == 200 {
                break;
            }
        }
    }
    assert_eq!(status, 200, "the owner's own reset link works");
    // Total so far: signup, the stranger's 2, the owner's reset = 4 of 6. Two more clients
    // with 2 each: .4's two fill it; .5's first still passes (a client's first always does),
    // its second meets the ceiling that protects the mailbox.
    for (i, source) in ["127.0.0.4", "127.0.0.5"].into_iter().enumerate() {
        for j in 0..2 {
            let body = json!({ "email": owner });
            post_from(
                &app,
                &from(source),
                "/v1/password-reset",
                &format!("y{i}{j}"),
                &body,
            )
            .await;
        }
    }
    assert_eq!(
        suppressed("from all clients").await,
        1,
        "each client's first email passes the total; the second of the last client is stopped"
    );
    // With the total used up by others, the owner — a client that has asked for nothing yet in
    // this window — still gets its link.
    let owner_again = from("127.0.0.6");
    post_from(
        &app,
        &owner_again,
        "/v1/magic-link",
        "late",
        &json!({ "email": owner }),
    )
    .await;
    drained(&app).await;
    let magic = app
        .inbox
        .messages(Some(owner))
        .into_iter()
        .rev()
        .find(|m| m.text.contains("/v1/magic-link/consume"))
        .expect("the owner's magic link arrives");
    assert_eq!(click(&app, &link_in(&magic), None).await.0, 200);
}

/// Waits (at most 10 s) until the outbox has nothing pending.
async fn drained(app: &TestApp) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while app
        .count("SELECT count(*) FROM oncely_outbox WHERE status = 'pending'")
        .await
        > 0
    {
        assert!(std::time::Instant::now() < deadline, "the outbox drains");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A link can leak (mail scanners, forwarded mail, logs): its holder gets a few tries at the
/// signup's password, then only "confirm without a password". The count survives the
/// rollback of every wrong try.
async fn whoever_sees_a_link_cannot_guess_the_signup_password_online(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let owner = "guessed@example.com";
    let signup = json!({ "email": owner, "password": "owner password" });
    app.post("/v1/signup", "s", &signup).await;
    let link = link_in(&app.emails_to(owner, 1).await[0]);
    for i in 0..5 {
        let (status, body) = click(&app, &link, Some(&format!("guess number {i}"))).await;
        assert_eq!((status, problem_type(&body)), (400, "password-mismatch"));
    }
    // Even the right password is refused now …
    let (status, body) = click(&app, &link, Some("owner password")).await;
    assert_eq!(
        (status, problem_type(&body)),
        (400, "invalid-request"),
        "{body}"
    );
    assert!(body["detail"].as_str().unwrap().contains("too many"));
    // … the address can still be confirmed, without adopting any password.
    let (status, body) = click(&app, &link, None).await;
    assert_eq!(status, 200);
    assert_eq!(body["password_set"], false);
    assert_eq!(password_hash_of(&app, owner).await, None);
}
