//! Security scans after an end-to-end run of every flow through the real binary (debug logs on;
//! the email change included):
//! no raw token or API key in any log line or database column, no full address in any log line
//! or in the idempotency table, no token or `Set-Cookie` in a stored response, and a key of one
//! tenant never replays for another.

use std::time::Duration;

use serde_json::{Value, json};

use crate::requests::{email, idempotent_post, smtp_inbox, token};
use crate::support::{count, dump, postgres_db, spawn_binary, token_in};

/// Creates a tenant with `oncely tenant create` and returns the API key it printed.
async fn create_tenant(database_url: &str, name: &str) -> String {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["tenant", "create", name, "--database-url", database_url])
        .output()
        .await
        .unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    stdout.lines().last().unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_leaks_into_logs_stored_responses_or_the_database() {
    let (url, _db) = postgres_db().await;
    let (inbox, mailer) = smtp_inbox().await;
    let mut process = spawn_binary(&url, &mailer, &[], &[]).await;
    let client = oncely_testdb::http();
    let post = |path: &str, key: &str, body: &Value, bearer: Option<&str>| {
        let mut request = idempotent_post(&client, &process.base, path, key).json(body);
        if let Some(api_key) = bearer {
            request = request.bearer_auth(api_key);
        }
        request.send()
    };
    let ok = async |path: &str, key: &str, body: &Value, bearer: Option<&str>, what: &str| {
        let r = post(path, key, body, bearer).await.unwrap();
        assert!(r.status().is_success(), "{what}: {}", r.status());
    };
    let mut tokens = Vec::new();
    let mut next_token = async |to: &str, n: usize| {
        let mail = inbox.wait_for(to, n, Duration::from_secs(10)).await;
        assert_eq!(mail.len(), n, "email {n} to {to}");
        let token = token_in(&mail[n - 1]);
        tokens.push(token.clone());
        token
    };
    let user = "sec.user@example.com";
    let signup = json!({"email": user, "password": "first password"});

    ok("/v1/signup", "s1", &signup, None, "signup").await;
    let t = next_token(user, 1).await;
    ok("/v1/verify", "v1", &token(&t), None, "verify").await;
    ok("/v1/password-reset", "r1", &email(user), None, "reset").await;
    let t = next_token(user, 2).await;
    let confirm = json!({"token": t, "password": "second password"});
    ok(
        "/v1/password-reset/confirm",
        "r2",
        &confirm,
        None,
        "confirm",
    )
    .await;
    ok("/v1/magic-link", "m1", &email(user), None, "magic link").await;
    let t = next_token(user, 3).await;
    ok("/v1/magic-link/consume", "m2", &token(&t), None, "consume").await;

    let api_key = create_tenant(&url, "acme").await;
    let guest = "sec.guest@example.com";
    let acme = Some(api_key.as_str());
    ok("/v1/invites", "i1", &email(guest), acme, "invite").await;
    let t = next_token(guest, 1).await;
    let accept = json!({"token": t, "password": "guest password"});
    ok("/v1/invites/accept", "a1", &accept, acme, "accept").await;

    // The guest moves to another address: the change request and its link.
    let moved = "sec.moved@example.com";
    let guest_id: String = {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
            .await
            .unwrap();
        sqlx::query_scalar(
            "SELECT id::text FROM oncely_users WHERE tenant = 'acme' AND email = 'sec.guest@example.com'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap()
    };
    let change = json!({ "new_email": moved });
    let path = format!("/v1/users/{guest_id}/email-change");
    ok(&path, "e1", &change, acme, "email change").await;
    let t = next_token(moved, 1).await;
    ok(
        "/v1/email-change/confirm",
        "e2",
        &token(&t),
        None,
        "email change confirm",
    )
    .await;

    // The default tenant's key "s1", with the same body, is a new request for tenant acme.
    let other = post("/v1/signup", "s1", &signup, Some(&api_key))
        .await
        .unwrap();
    assert_eq!(other.status(), 202);
    assert!(
        other.headers().get("idempotent-replayed").is_none(),
        "a key of one tenant replayed for another"
    );
    assert_eq!(
        count(
            &url,
            "SELECT count(*) FROM oncely_users WHERE email = 'sec.user@example.com'"
        )
        .await,
        2
    );
    let replay = post("/v1/signup", "s1", &signup, None).await.unwrap();
    assert_eq!(
        replay
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );

    let database = dump(&url).await;
    assert!(database.contains(user), "the dump covers the tables");
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    let stored: Vec<String> = sqlx::query_scalar(
        "SELECT concat_ws(' ', idem_key, response_headers::text, convert_from(coalesce(response_body, ''), 'UTF8'), t::text)
           FROM oncely_idempotency_keys t",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(
        stored.len() >= 8,
        "every flow stored its response: {stored:?}"
    );

    process.child.kill().await.unwrap();
    let logs = process.stderr.await.unwrap();
    assert!(
        logs.contains("signup accepted") && logs.lines().count() > 20,
        "the logs were captured"
    );

    for token in tokens.iter().chain([&api_key]) {
        assert!(
            !logs.contains(token.as_str()),
            "a raw token or API key in the logs"
        );
        assert!(
            !database.contains(token.as_str()),
            "a raw token or API key in the database"
        );
        assert!(
            stored.iter().all(|row| !row.contains(token.as_str())),
            "a token in a stored response"
        );
    }
    for address in [user, guest, moved, "sec.user", "sec.guest", "sec.moved"] {
        assert!(!logs.contains(address), "{address} in the logs");
        assert!(
            stored.iter().all(|row| !row.contains(address)),
            "{address} in the idempotency table"
        );
    }
    assert!(
        stored
            .iter()
            .all(|row| !row.to_ascii_lowercase().contains("set-cookie")),
        "a stored response with Set-Cookie"
    );
}
