//! The attacker's side of every account flow (docs/security.md, the threat model), walked the way real
//! callers walk them: the application's backend with its tenant's API key, and the address
//! owner's browser — the GET page from the email, then the POST its button sends, with no API
//! key — on a tenant other than the default.

use std::time::Duration;

use argon2::{PasswordHash, PasswordVerifier};
use oncely_server::environment::Environment;
use oncely_server::settings::Settings;
use oncely_testdb::TestDb;
use serde_json::{Value, json};

use crate::requests::{
    ACME_MEMBERSHIPS, ACME_VERIFIED_USERS, SENT_JOBS, VERIFIED_USERS, app_with_mail_caps,
    assert_counts, assert_drained, click, click_nth, client_from, email, idempotent_post, link_in,
    nth_link, nth_token, problem_type, token,
};
use crate::support::{
    SECRET, TestApp, both_databases, execute, secret, spawn_app_on, spawn_app_with_inbox,
    start_inbox,
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
    a_reused_login_key_is_no_password_oracle_and_replays_no_stale_identity,
    every_v1_route_reads_at_most_16_kib_with_a_key_or_without,
    an_address_the_mailer_cannot_send_to_is_refused_at_the_door,
    a_login_key_reused_after_the_address_moved_replays_no_other_account,
);

/// `/metrics` counts emails sent and skipped by kind: from outside, a before/after scrape
/// around a reset request would tell a registered address from an unknown one.
#[tokio::test]
async fn metrics_are_not_an_enumeration_oracle_in_production() {
    let (url, _db) = crate::support::sqlite_db().await;
    // Production runs on a migrated database only.
    crate::support::migrate(&url).await;
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
    let mut req = client_from(source).get(format!("{}/metrics", app.base));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send().await.unwrap().status().as_u16()
}

async fn password_hash_of(app: &TestApp, email: &str) -> Option<String> {
    let sql = format!("SELECT password_hash FROM oncely_users WHERE email = '{email}'");
    let url = app.database_url.as_str();
    // The same query on either database: only the connection's type differs.
    macro_rules! fetch_on {
        ($connection:ty) => {{
            let mut conn = <$connection as sqlx::Connection>::connect(url)
                .await
                .unwrap();
            let query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
            query.fetch_one(&mut conn).await.unwrap()
        }};
    }
    if url.starts_with("postgres") {
        fetch_on!(sqlx::PgConnection)
    } else {
        fetch_on!(sqlx::SqliteConnection)
    }
}

fn verifies(phc: &str, password: &str) -> bool {
    let parsed = PasswordHash::new(phc).unwrap();
    argon2::Argon2::default()
        .verify_password(password.as_bytes(), &parsed)
        .is_ok()
}

/// Whether the account of `email` has a password and it is `password`.
async fn holds_password(app: &TestApp, email: &str, password: &str) -> bool {
    verifies(
        &password_hash_of(app, email).await.expect("a password"),
        password,
    )
}

/// A signup's body: the address and the password its sender chose.
fn signup(email: &str, password: &str) -> Value {
    json!({ "email": email, "password": password })
}

/// An app on which `owner` signed up (with the Idempotency-Key `key`) and the password
/// "owner password"; the link in the email that followed.
async fn owners_signup(url: &str, owner: &str, key: &str) -> (TestApp, String) {
    let app = spawn_app_on(url, |_| {}).await;
    app.post("/v1/signup", key, &signup(owner, "owner password"))
        .await;
    let link = nth_link(&app, owner, 1).await;
    (app, link)
}

async fn a_pre_registered_password_is_never_adopted_by_the_owner(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let victim = "victim@example.com";
    // The attacker signs up with the victim's address and a password of its own.
    let attack = signup(victim, "attacker password");
    assert_eq!(
        app.post("/v1/signup", "attack", &attack).await.status(),
        202
    );
    assert_eq!(
        password_hash_of(&app, victim).await,
        None,
        "a pending account holds no password"
    );
    let link = nth_link(&app, victim, 1).await;
    // The owner, who never chose that password, cannot adopt it by typing its own …
    let (status, body) = click(&app, &link, Some("owner password")).await;
    assert_eq!((status, problem_type(&body)), (400, "password-mismatch"));
    // … and confirming without one verifies the address and leaves no password to sign in with.
    let (status, body) = click(&app, &link, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({ "status": "verified", "password_set": false }));
    assert_eq!(password_hash_of(&app, victim).await, None);
    assert_counts(&app, &[(VERIFIED_USERS, 1)]).await;
}

async fn the_signups_own_password_is_adopted_when_re_entered(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let owner = "owner@example.com";
    let body = signup(owner, "owner password");
    assert_eq!(app.post("/v1/signup", "s1", &body).await.status(), 202);
    let (status, body) = click_nth(&app, owner, 1, Some("owner password")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({ "status": "verified", "password_set": true }));
    assert!(holds_password(&app, owner, "owner password").await);
    assert!(!holds_password(&app, owner, "attacker password").await);
}

async fn verifying_by_another_link_ends_signup_links_and_adopts_no_password(
    url: String,
    _db: TestDb,
) {
    let app = spawn_app_on(&url, |_| {}).await;
    let victim = "magic-victim@example.com";
    let attack = signup(victim, "attacker password");
    app.post("/v1/signup", "attack", &attack).await;
    let signup_link = nth_link(&app, victim, 1).await;
    // The owner signs in with a magic link: the address is proven, no password is adopted.
    app.post("/v1/magic-link", "m1", &email(victim)).await;
    let (status, body) = click_nth(&app, victim, 2, None).await;
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
    let owner = "raced@example.com";
    let (app, my_link) = owners_signup(&url, owner, "mine").await;
    let theirs = signup(owner, "attacker password");
    app.post("/v1/signup", "theirs", &theirs).await;
    let their_link = nth_link(&app, owner, 2).await;
    assert_ne!(my_link, their_link);
    let (status, body) = click(&app, &my_link, Some("owner password")).await;
    assert_eq!(status, 200, "the owner's own link still works: {body}");
    assert_eq!(body["password_set"], true);
    // Verified: the stranger's link is over.
    let (status, _) = click(&app, &their_link, Some("attacker password")).await;
    assert_eq!(status, 400);
    assert!(holds_password(&app, owner, "owner password").await);
}

async fn an_invite_to_a_pre_registered_address_sets_the_invitees_password(
    url: String,
    _db: TestDb,
) {
    let app = spawn_app_on(&url, |_| {}).await;
    let key = app.create_tenant("acme").await;
    let guest = "pre-registered-guest@example.com";
    // The attacker pre-registers the address in the tenant the invitation will come from.
    let attack = signup(guest, "attacker password");
    app.post_as(&key, "/v1/signup", "attack", &attack).await;
    let signup_link = nth_link(&app, guest, 1).await;
    app.post_as(&key, "/v1/invites", "invite", &email(guest))
        .await;
    let (status, body) = click_nth(&app, guest, 2, Some("guest password")).await;
    assert_eq!((status, &body["status"]), (200, &json!("joined")), "{body}");
    assert!(holds_password(&app, guest, "guest password").await);
    let (status, _) = click(&app, &signup_link, Some("attacker password")).await;
    assert_eq!(
        status, 400,
        "the pre-registration's link ended with the invite"
    );
    assert!(holds_password(&app, guest, "guest password").await);
}

async fn every_link_of_a_non_default_tenant_works_from_a_browser(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let key = app.create_tenant("acme").await;
    // The application's backend asks for every kind of email, with its tenant's key.
    let user = "acme-user@example.com";
    let body = signup(user, "user password");
    assert_eq!(
        app.post_as(&key, "/v1/signup", "s", &body).await.status(),
        202
    );
    let (status, body) = click_nth(&app, user, 1, Some("user password")).await;
    assert_eq!(status, 200, "verification link: {body}");
    assert_eq!(body["password_set"], true);
    app.post_as(&key, "/v1/password-reset", "r", &email(user))
        .await;
    let (status, body) = click_nth(&app, user, 2, Some("a new password")).await;
    assert_eq!(status, 200, "reset link: {body}");
    assert!(holds_password(&app, user, "a new password").await);
    app.post_as(&key, "/v1/magic-link", "m", &email(user)).await;
    let (status, body) = click_nth(&app, user, 3, None).await;
    assert_eq!(status, 200, "magic link: {body}");
    let guest = "acme-guest@example.com";
    app.post_as(&key, "/v1/invites", "i", &email(guest)).await;
    let (status, body) = click_nth(&app, guest, 1, None).await;
    assert_eq!(status, 200, "invite link: {body}");
    // Everything happened in the tenant, nothing in the default one.
    let outside_acme = "SELECT count(*) FROM oncely_users WHERE tenant <> 'acme'";
    let counts = [
        (ACME_VERIFIED_USERS, 2),
        (ACME_MEMBERSHIPS, 1),
        (outside_acme, 0),
    ];
    assert_counts(&app, &counts).await;
}

async fn a_tenants_link_is_useless_with_another_tenants_api_key(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let acme = app.create_tenant("acme").await;
    let globex = app.create_tenant("globex").await;
    let user = "shared@example.com";
    app.post_as(&acme, "/v1/signup", "s", &email(user)).await;
    let verification = nth_token(&app, user, 1).await;
    // Tenant B's backend presents tenant A's token: one generic answer, nothing used.
    let answer = app
        .post_as(&globex, "/v1/verify", "v-globex", &token(&verification))
        .await;
    assert_eq!(answer.status(), 400);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(problem_type(&body), "token-invalid");
    // … and the same invitation flow: acme's invite cannot be accepted into globex.
    let guest = "guest@example.com";
    app.post_as(&acme, "/v1/invites", "i", &email(guest)).await;
    let invite = token(&nth_token(&app, guest, 1).await);
    let accept = "/v1/invites/accept";
    let answer = app.post_as(&globex, accept, "a-globex", &invite).await;
    assert_eq!(answer.status(), 400);
    assert_counts(&app, &[("SELECT count(*) FROM oncely_memberships", 0)]).await;
    // The owner's own click (no API key) still works: the link was not used up.
    let answer = app
        .post("/v1/verify", "v-owner", &token(&verification))
        .await;
    assert_eq!(answer.status(), 200);
    let answer = app.post_as(&acme, accept, "a-acme", &invite).await;
    assert_eq!(answer.status(), 200);
    assert_counts(&app, &[(ACME_MEMBERSHIPS, 1)]).await;
}

async fn a_secret_rotation_keeps_retries_links_and_queued_emails_working(url: String, _db: TestDb) {
    const NEXT: &str = "the-next-server-secret-0123456789-abcdef";
    // Before the rotation: an API process without workers, so the email job waits in the outbox.
    let (inbox, running) = start_inbox(oncely_inbox::Faults::default()).await;
    let before = spawn_app_with_inbox(&url, inbox.clone(), running, |s| s.workers = 0).await;
    let owner = "rotated@example.com";
    let body = signup(owner, "owner password");
    let first = before.post("/v1/signup", "rotation", &body).await;
    assert_eq!(first.status(), 202);
    let first_body = first.text().await.unwrap();

    // After it: ONCELY_SECRET is new, the old one is ONCELY_SECRET_PREVIOUS.
    let after = spawn_app_on(&url, |s| {
        s.secret = secret(NEXT).with_previous(vec![secret(SECRET)]);
    })
    .await;
    let retry = after.post("/v1/signup", "rotation", &body).await;
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
    let (status, answer) = click_nth(&after, owner, 1, Some("owner password")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["password_set"], true);
    assert_counts(&after, &[(SENT_JOBS, 1)]).await;

    // Without the previous secret, the same retry is another request (what the ring prevents).
    let forgotten = spawn_app_on(&url, |s| s.secret = secret(NEXT)).await;
    let lost = forgotten.post("/v1/signup", "rotation", &body).await;
    assert_eq!(lost.status(), 422);
}

async fn the_same_key_with_another_query_is_refused_not_replayed(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let body = email("query@example.com");
    let post = async |path: &str| {
        idempotent_post(&app.client, &app.base, path, "one-key")
            .json(&body)
            .send()
            .await
            .unwrap()
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
    // Each way of proving a pending address an old release planted a password on: the
    // signup's own link (no other email), or the link of the email asked for at `proof`; with
    // the password typed on the link's page. The account then holds that password, or none —
    // never the planted one.
    let cases = [
        ("old-verify@example.com", None, None),
        ("old-magic@example.com", Some("/v1/magic-link"), None),
        (
            "old-invite@example.com",
            Some("/v1/invites"),
            Some("guest password"),
        ),
        ("old-invite-nopw@example.com", Some("/v1/invites"), None),
        (
            "old-reset@example.com",
            Some("/v1/password-reset"),
            Some("owner's new password"),
        ),
    ];
    for (address, proof, password) in cases {
        let signup_key = format!("signup-{address}");
        app.post_as(&key, "/v1/signup", &signup_key, &email(address))
            .await;
        app.emails_to(address, 1).await;
        execute(
            &url,
            &format!(
                "UPDATE oncely_users SET password_hash = '{attacker_hash}' WHERE email = '{address}'"
            ),
        )
        .await;
        let n = match proof {
            Some(path) => {
                let proof_key = format!("proof-{address}");
                app.post_as(&key, path, &proof_key, &email(address)).await;
                2
            }
            None => 1,
        };
        let (status, body) = click_nth(&app, address, n, password).await;
        assert_eq!(status, 200, "{address}: {body}");
        if proof.is_none() {
            assert_eq!(body["password_set"], json!(false), "{address}");
        }
        match password {
            Some(password) => assert!(holds_password(&app, address, password).await),
            None => assert_eq!(password_hash_of(&app, address).await, None, "{address}"),
        }
    }
}

async fn a_strangers_resend_does_not_cancel_the_owners_signup_link(url: String, _db: TestDb) {
    let owner = "resent@example.com";
    let (app, my_link) = owners_signup(&url, owner, "mine").await;
    // Anyone may ask for a resend (no API key on the default tenant).
    app.post("/v1/verification/resend", "theirs", &email(owner))
        .await;
    // The resent link carries no password: re-entering one there says so …
    let (status, body) = click_nth(&app, owner, 2, Some("owner password")).await;
    assert_eq!((status, problem_type(&body)), (400, "invalid-request"));
    // … and the owner's own signup link still sets the owner's password.
    let (status, body) = click(&app, &my_link, Some("owner password")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["password_set"], true);
    assert!(holds_password(&app, owner, "owner password").await);
}

/// Asks for an email to `owner` from `client`, which is accepted whatever the caps say.
async fn ask_from(app: &TestApp, client: &reqwest::Client, path: &str, key: &str, owner: &str) {
    let answer = idempotent_post(client, &app.base, path, key)
        .json(&email(owner))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
}

/// The per-address cap is per client: a stranger who asks for the owner's emails until the cap
/// is reached uses up only its own share; the owner, from another address, still gets its
/// reset link. Many clients together meet the total ceiling.
async fn a_stranger_cannot_use_up_the_owners_emails(url: String, _db: TestDb) {
    let app = app_with_mail_caps(&url, 2, 1000, |s| s.limits.per_address_total = 6).await;
    let owner = "capped-owner@example.com";
    let (stranger, owner_client) = (client_from("127.0.0.2"), client_from("127.0.0.3"));
    ask_from(&app, &owner_client, "/v1/signup", "own", owner).await;
    // The stranger asks for the owner's reset link ten times: 2 pass, 8 are suppressed, and
    // only the 2 count toward the mailbox's total.
    for i in 0..10 {
        let key = format!("x{i}");
        ask_from(&app, &stranger, "/v1/password-reset", &key, owner).await;
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
    ask_from(&app, &owner_client, "/v1/password-reset", "mine", owner).await;
    assert_eq!(suppressed("to this address\"").await, 8, "not the owner's");
    assert_drained(&app, Duration::from_secs(10)).await;
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
            let (client, key) = (client_from(source), format!("y{i}{j}"));
            ask_from(&app, &client, "/v1/password-reset", &key, owner).await;
        }
    }
    assert_eq!(
        suppressed("from all clients").await,
        1,
        "each client's first email passes the total; the second of the last client is stopped"
    );
    // With the total used up by others, the owner — a client that has asked for nothing yet in
    // this window — still gets its link.
    let owner_again = client_from("127.0.0.6");
    ask_from(&app, &owner_again, "/v1/magic-link", "late", owner).await;
    assert_drained(&app, Duration::from_secs(10)).await;
    let magic = app
        .inbox
        .messages(Some(owner))
        .into_iter()
        .rev()
        .find(|m| m.text.contains("/v1/magic-link/consume"))
        .expect("the owner's magic link arrives");
    assert_eq!(click(&app, &link_in(&magic), None).await.0, 200);
}

/// A link can leak (mail scanners, forwarded mail, logs): its holder gets a few tries at the
/// signup's password, then only "confirm without a password". The count survives the
/// rollback of every wrong try.
async fn whoever_sees_a_link_cannot_guess_the_signup_password_online(url: String, _db: TestDb) {
    let owner = "guessed@example.com";
    let (app, link) = owners_signup(&url, owner, "s").await;
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

/// Review of issue 20 (F1): the right password counted as an attempt, and a request that
/// failed after the check (here its lock wait on the account ran past the timeout: 503) never
/// gave it back, so an owner retrying through six busy moments found the link "guessed out".
/// Only wrong passwords count.
#[tokio::test]
async fn the_right_password_retried_through_503s_does_not_use_up_the_links_attempts() {
    use sqlx::Connection;

    let (url, _db) = crate::support::postgres_db().await;
    let owner = "busy@example.com";
    let (app, link) = owners_signup(&url, owner, "s").await;
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut held = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM oncely_users WHERE email = $1 FOR UPDATE")
        .bind(owner)
        .execute(&mut *held)
        .await
        .unwrap();
    for _ in 0..6 {
        let (status, body) = click(&app, &link, Some("owner password")).await;
        assert_eq!(
            (status, problem_type(&body)),
            (503, "storage-unavailable"),
            "{body}"
        );
    }
    held.rollback().await.unwrap();
    let (status, body) = click(&app, &link, Some("owner password")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["password_set"], true);
    assert!(password_hash_of(&app, owner).await.is_some());
}

/// A backend that reuses an Idempotency-Key on `POST /v1/login` (one per user, say) must give an
/// attacker at one client no more guesses than without a key: each guess under the key is
/// counted and throttled like any other (429 after the per-address limit), never answered 422
/// uncounted; and the right password under the key replays the identity only while it is
/// still the right password.
async fn a_reused_login_key_is_no_password_oracle_and_replays_no_stale_identity(
    url: String,
    _db: TestDb,
) {
    let app = spawn_app_on(&url, |s| {
        s.login.per_address = 5;
        s.login.per_address_total = 20;
        s.login.per_client = 100;
        s.limits.per_address = 100;
        s.limits.per_client = 1000;
    })
    .await;
    let acme = app.create_tenant("acme").await;
    let ada = "ada@acme.test";
    let password = "correct horse battery";
    let signup = json!({ "email": ada, "password": password });
    assert_eq!(
        app.status_as(&acme, "/v1/signup", "s-ada", &signup).await,
        202
    );
    let confirm = json!({ "token": nth_token(&app, ada, 1).await, "password": password });
    assert_eq!(
        app.status_as(&acme, "/v1/verify", "v-ada", &confirm).await,
        200
    );

    // The backend's login for its user at 198.51.100.7, with the key it reuses.
    let login = |client: &'static str, guess: &'static str| {
        let request = app
            .client
            .post(format!("{}/v1/login", app.base))
            .bearer_auth(&acme)
            .header("idempotency-key", "login-ada")
            .header("oncely-client-ip", client)
            .json(&json!({ "email": ada, "password": guess }));
        async move {
            loop {
                let response = request.try_clone().unwrap().send().await.unwrap();
                // 503 busy: the hashing pool, shared by the tests running at once.
                if response.status() != 503 {
                    return response;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let first = login("198.51.100.7", password).await;
    assert_eq!(first.status(), 200);
    let identity: Value = first.json().await.unwrap();

    // 30 guesses under the same key from one client: 401 up to the limit, then 429.
    let mut statuses = Vec::new();
    for _ in 0..30 {
        statuses.push(
            login("198.51.100.8", "a wrong guess")
                .await
                .status()
                .as_u16(),
        );
    }
    assert!(
        !statuses.contains(&422),
        "a reused key is no uncounted answer: {statuses:?}"
    );
    assert_eq!(&statuses[..5], &[401; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    // The right password, from the throttled client: refused before any check too.
    assert_eq!(login("198.51.100.8", password).await.status(), 429);

    // From the owner's client the key still replays the identity…
    let replayed = login("198.51.100.7", password).await;
    assert_eq!(replayed.status(), 200);
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    assert_eq!(
        replayed.json::<Value>().await.unwrap()["user_id"],
        identity["user_id"]
    );
    // …until the password changes: then the old one under the same key is a failure.
    let reset = app
        .post_as(
            &acme,
            "/v1/password-reset",
            "r-ada",
            &json!({ "email": ada }),
        )
        .await;
    assert_eq!(reset.status(), 202);
    let new_password = "a brand new battery";
    let confirm = json!({ "token": nth_token(&app, ada, 2).await, "password": new_password });
    let confirmed = app
        .post_as(&acme, "/v1/password-reset/confirm", "rc-ada", &confirm)
        .await;
    assert_eq!(confirmed.status(), 200);
    let stale = login("198.51.100.7", password).await;
    assert_eq!(
        stale.status(),
        401,
        "a replay of an identity its password no longer proves"
    );
    assert!(stale.headers().get("idempotent-replayed").is_none());
    let renewed = login("198.51.100.7", new_password).await;
    assert_eq!(renewed.status(), 200);
    assert_eq!(
        renewed.json::<Value>().await.unwrap()["user_id"],
        identity["user_id"]
    );

    // A password no account could have is refused before any hashing, under a key or not.
    let long = "x".repeat(129);
    let refused = app
        .client
        .post(format!("{}/v1/login", app.base))
        .bearer_auth(&acme)
        .json(&json!({ "email": ada, "password": long }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
}

/// One body limit for every `/v1` route: a body over 16 KiB is 413 `request-too-large` with or
/// without a key, with or without an API key (login took ~2 MB and hashed a 1.5 MB password).
async fn every_v1_route_reads_at_most_16_kib_with_a_key_or_without(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let acme = app.create_tenant("acme").await;
    let big = json!({ "email": "ada@acme.test", "password": "p".repeat(17 * 1024) });
    let routes = [
        "/v1/signup",
        "/v1/login",
        "/v1/exchange",
        "/v1/verify",
        "/v1/verification/resend",
        "/v1/password-reset",
        "/v1/password-reset/confirm",
        "/v1/magic-link",
        "/v1/magic-link/consume",
        "/v1/invites",
        "/v1/invites/accept",
        "/v1/email-change/confirm",
    ];
    for route in routes {
        for key in [Some("big-1"), None] {
            for api_key in [Some(acme.as_str()), None] {
                let mut request = app.client.post(format!("{}{route}", app.base)).json(&big);
                if let Some(key) = key {
                    request = request.header("idempotency-key", key);
                }
                if let Some(api_key) = api_key {
                    request = request.bearer_auth(api_key);
                }
                let response = request.send().await.unwrap();
                let status = response.status().as_u16();
                let what = format!("{route} key {key:?} api key {}", api_key.is_some());
                // Without a key a keyed route may say 400 (key missing) first: it read nothing.
                if key.is_none() && status == 400 && route != "/v1/login" {
                    continue;
                }
                // Without an API key login and exchange are 401 before any body is read.
                if api_key.is_none() && status == 401 {
                    continue;
                }
                assert_eq!(status, 413, "{what}");
                let problem: Value = response.json().await.unwrap();
                assert_eq!(problem_type(&problem), "request-too-large", "{what}");
            }
        }
    }
    // Just under the limit, login answers as for any wrong password: the limit is the body's.
    let fits = json!({ "email": "ada@acme.test", "password": "p".repeat(100) });
    let mut status = 503;
    // 503: the password hashers (shared by the tests running at once) were busy; retried.
    for _ in 0..100 {
        let response = app
            .client
            .post(format!("{}/v1/login", app.base))
            .bearer_auth(&acme)
            .json(&fits)
            .send()
            .await
            .unwrap();
        status = response.status().as_u16();
        if status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, 401);
}

/// A quoted local part is a valid RFC 5322 address that the mailer refuses: accepted at
/// signup, it died in the worker ("Invalid email user") with markup in its address. Every
/// route that names an address refuses it 400 before anything is written.
async fn an_address_the_mailer_cannot_send_to_is_refused_at_the_door(url: String, _db: TestDb) {
    let app = spawn_app_on(&url, |_| {}).await;
    let acme = app.create_tenant("acme").await;
    for (n, address) in [
        "\"<img src=x onerror=alert(1)>\"@acme.test",
        "\"ada lovelace\"@acme.test",
    ]
    .into_iter()
    .enumerate()
    {
        for (route, body) in [
            (
                "/v1/signup",
                json!({ "email": address, "password": "correct horse battery" }),
            ),
            ("/v1/verification/resend", email(address)),
            ("/v1/password-reset", email(address)),
            ("/v1/magic-link", email(address)),
            ("/v1/invites", email(address)),
        ] {
            let response = app
                .post_as(&acme, route, &format!("{route}-{n}"), &body)
                .await;
            assert_eq!(response.status(), 400, "{route} {address}");
            let problem: Value = response.json().await.unwrap();
            assert_eq!(
                problem_type(&problem),
                "invalid-request",
                "{route} {address}"
            );
        }
    }
    assert_eq!(app.count("SELECT count(*) FROM oncely_users").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM oncely_outbox").await, 0);
}

/// A login key reused after its address moved to another account (an email change freed it, a
/// stranger signed up with it) must not replay the first account's identity to the stranger:
/// the key's fingerprint covers the account the password proved, so it is a 422.
async fn a_login_key_reused_after_the_address_moved_replays_no_other_account(
    url: String,
    _db: TestDb,
) {
    let app = spawn_app_on(&url, |s| {
        s.limits.per_address = 100;
        s.limits.per_client = 1000;
    })
    .await;
    let acme = app.create_tenant("acme").await;
    let (ada, moved) = ("ada@acme.test", "ada2@acme.test");
    let (hers, his) = ("correct horse battery", "mallory's own battery");
    let login = |key: &'static str, password: &'static str| {
        let body = json!({ "email": ada, "password": password });
        let (app, acme) = (&app, &acme);
        async move {
            // 503: the password hashers (shared by the tests running at once) were busy.
            for _ in 0..100 {
                let response = app.post_as(acme, "/v1/login", key, &body).await;
                if response.status() != 503 {
                    return response;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("503 a hundred times")
        }
    };
    let signup = json!({ "email": ada, "password": hers });
    assert_eq!(
        app.status_as(&acme, "/v1/signup", "s-ada", &signup).await,
        202
    );
    let confirm = json!({ "token": nth_token(&app, ada, 1).await, "password": hers });
    assert_eq!(
        app.status_as(&acme, "/v1/verify", "v-ada", &confirm).await,
        200
    );
    let first = login("swap-1", hers).await;
    assert_eq!(first.status(), 200);
    let ada_id = first.json::<Value>().await.unwrap()["user_id"].clone();

    // Ada moves to another address; the old one is free.
    let change = format!("/v1/users/{}/email-change", ada_id.as_str().unwrap());
    let asked = app
        .post_as(&acme, &change, "c-ada", &json!({ "new_email": moved }))
        .await;
    assert_eq!(asked.status(), 202);
    let moving = json!({ "token": nth_token(&app, moved, 1).await });
    let confirmed = app
        .post_as(&acme, "/v1/email-change/confirm", "cc-ada", &moving)
        .await;
    assert_eq!(confirmed.status(), 200);
    // Mallory takes the old address, with a password of his own.
    crate::requests::assert_drained(&app, Duration::from_secs(10)).await;
    app.inbox.clear();
    let signup = json!({ "email": ada, "password": his });
    assert_eq!(
        app.status_as(&acme, "/v1/signup", "s-mal", &signup).await,
        202
    );
    let confirm = json!({ "token": nth_token(&app, ada, 1).await, "password": his });
    assert_eq!(
        app.status_as(&acme, "/v1/verify", "v-mal", &confirm).await,
        200
    );
    let fresh = login("swap-2", his).await;
    assert_eq!(fresh.status(), 200);
    let mallory_id = fresh.json::<Value>().await.unwrap()["user_id"].clone();
    assert_ne!(mallory_id, ada_id);

    // The first key, his password: not Ada's identity.
    let reused = login("swap-1", his).await;
    let status = reused.status().as_u16();
    let body: Value = reused.json().await.unwrap();
    assert_ne!(
        body.get("user_id"),
        Some(&ada_id),
        "another account's identity: {body}"
    );
    assert_eq!(
        (status, problem_type(&body)),
        (422, "idempotency-key-reused"),
        "{body}"
    );
}
