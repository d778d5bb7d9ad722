//! Security scans after an end-to-end run of every flow through the real binary (debug logs on):
//! no raw token or API key in any log line or database column, no full address in any log line
//! or in the idempotency table, no token or `Set-Cookie` in a stored response, and a key of one
//! tenant never replays for another.

use std::time::Duration;

use oncely_inbox::Faults;
use serde_json::{Value, json};

use crate::support::{count, dump, postgres_db, spawn_binary, start_inbox, token_in};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_leaks_into_logs_stored_responses_or_the_database() {
    let (url, _db) = postgres_db().await;
    let (inbox, running) = start_inbox(Faults::default()).await;
    let mailer = format!("smtp://{}", running.smtp_addr);
    let mut process = spawn_binary(&url, &mailer, &[], &[]).await;
    let client = oncely_testdb::http();
    let post = |path: &str, key: &str, body: Value, bearer: Option<&str>| {
        let mut request = client
            .post(format!("{}{path}", process.base))
            .header("idempotency-key", key)
            .json(&body);
        if let Some(api_key) = bearer {
            request = request.bearer_auth(api_key);
        }
        request.send()
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
    let ok = |r: reqwest::Response, what: &str| {
        assert!(r.status().is_success(), "{what}: {}", r.status());
    };

    ok(
        post(
            "/v1/signup",
            "s1",
            json!({"email": user, "password": "first password"}),
            None,
        )
        .await
        .unwrap(),
        "signup",
    );
    let t = next_token(user, 1).await;
    ok(
        post("/v1/verify", "v1", json!({"token": t}), None)
            .await
            .unwrap(),
        "verify",
    );
    ok(
        post("/v1/password-reset", "r1", json!({"email": user}), None)
            .await
            .unwrap(),
        "reset",
    );
    let t = next_token(user, 2).await;
    ok(
        post(
            "/v1/password-reset/confirm",
            "r2",
            json!({"token": t, "password": "second password"}),
            None,
        )
        .await
        .unwrap(),
        "confirm",
    );
    ok(
        post("/v1/magic-link", "m1", json!({"email": user}), None)
            .await
            .unwrap(),
        "magic link",
    );
    let t = next_token(user, 3).await;
    ok(
        post("/v1/magic-link/consume", "m2", json!({"token": t}), None)
            .await
            .unwrap(),
        "consume",
    );

    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["tenant", "create", "acme", "--database-url", &url])
        .output()
        .await
        .unwrap();
    assert!(output.status.success());
    let api_key = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .trim()
        .to_owned();
    let guest = "sec.guest@example.com";
    ok(
        post("/v1/invites", "i1", json!({"email": guest}), Some(&api_key))
            .await
            .unwrap(),
        "invite",
    );
    let t = next_token(guest, 1).await;
    ok(
        post(
            "/v1/invites/accept",
            "a1",
            json!({"token": t, "password": "guest password"}),
            Some(&api_key),
        )
        .await
        .unwrap(),
        "accept",
    );

    // The default tenant's key "s1", with the same body, is a new request for tenant acme.
    let other = post(
        "/v1/signup",
        "s1",
        json!({"email": user, "password": "first password"}),
        Some(&api_key),
    )
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
    let replay = post(
        "/v1/signup",
        "s1",
        json!({"email": user, "password": "first password"}),
        None,
    )
    .await
    .unwrap();
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
    for address in [user, guest, "sec.user", "sec.guest"] {
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
