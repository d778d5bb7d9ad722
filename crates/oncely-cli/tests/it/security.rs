//! Security scans after an end-to-end run of every flow through the real binary (debug logs on;
//! the email change included):
//! no raw token, code, API key or password in any log line or database column, no full address
//! in any log line or in the idempotency table (the identity an exchange or a login answers
//! included), no token, code or `Set-Cookie` in a stored response, and a key of one tenant never
//! replays for another.

use std::time::Duration;

use serde_json::{Value, json};

use crate::requests::{email, idempotent_post, smtp_inbox, token};
use crate::support::{
    count, create_tenant, dump, postgres_db, set_return_url, spawn_binary, token_in,
};

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
    let callback = "https://app.example.com/auth/callback";
    set_return_url(&url, "acme", callback).await;
    let guest = "sec.guest@example.com";
    let acme = Some(api_key.as_str());
    ok("/v1/invites", "i1", &email(guest), acme, "invite").await;
    let t = next_token(guest, 1).await;
    let accept = json!({"token": t, "password": "guest password"});
    // Used with a return URL: a code in the redirect, exchanged once (and retried).
    let mut codes = Vec::new();
    for _ in 0..2 {
        let answer = post("/v1/invites/accept", "a1", &accept, acme)
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        let answer: Value = answer.json().await.unwrap();
        let redirect = answer["redirect"].as_str().expect("a redirect").to_owned();
        codes.push(redirect.split("code=").nth(1).unwrap().to_owned());
    }
    assert_eq!(codes[0], codes[1], "a retry replays the same code");
    let code = json!({ "code": codes[0] });
    for _ in 0..2 {
        let identity = post("/v1/exchange", "x1", &code, acme).await.unwrap();
        assert_eq!(identity.status(), 200);
        let identity: Value = identity.json().await.unwrap();
        assert_eq!(identity["email"], guest);
    }
    let exchanged_code = codes[0].clone();

    // Login (acme's API key): with a key (the identity is stored and replayed), without one,
    // and a failure (never stored).
    let login = async |key: Option<&str>, password: &str| {
        let body = json!({"email": guest, "password": password});
        let mut request = client
            .post(format!("{}/v1/login", process.base))
            .bearer_auth(&api_key)
            .json(&body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send().await.unwrap().status().as_u16()
    };
    assert_eq!(login(Some("l1"), "guest password").await, 200);
    assert_eq!(login(Some("l1"), "guest password").await, 200);
    assert_eq!(login(None, "guest password").await, 200);
    assert_eq!(login(Some("l2"), "wrong guest password").await, 401);
    assert_eq!(login(None, "wrong guest password").await, 401);

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

    tokens.push(exchanged_code);
    for token in tokens.iter().chain([&api_key]) {
        assert!(
            !logs.contains(token.as_str()),
            "a raw token, code or API key in the logs"
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
    let passwords = [
        "first password",
        "second password",
        "guest password",
        "wrong guest password",
    ];
    for password in passwords {
        assert!(!logs.contains(password), "a password in the logs");
        assert!(!database.contains(password), "a password in the database");
    }
    // A login's identity is stored (and replayed), its failures not; like the exchange's, the
    // stored identity holds no address: it is added on the way out.
    let identities = stored
        .iter()
        .filter(|row| row.contains("\"flow\":\"password\""))
        .count();
    assert_eq!(identities, 1, "one login stored, its failures not");
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
