//! Issue 16, items 1-3, 5: per-tenant return URLs, the one-time code a used link mints, and
//! `POST /v1/exchange`. Every test runs on a non-default tenant created with its API key, through
//! the real HTTP routes; the links are used as a browser does (no API key), the codes exchanged
//! as the application's backend does (the tenant's key).

use serde_json::{Value, json};

use oncely_testdb::TestDb;

use crate::requests::{
    app_with_mail_caps, assert_counts, client_from, email, nth_token, problem_type, token,
};
use crate::support::{TestApp, both_databases, dump, execute, oncely_binary, run_to_end};

const CALLBACK: &str = "https://app.example.com/auth/callback";
const LOCAL: &str = "http://127.0.0.1:9/alt?from=mail";

async fn app(url: &str) -> TestApp {
    app_with_mail_caps(url, 100, 1000, |_| {}).await
}

/// `oncely tenant …` on the app's database: (exit code, stdout, stderr).
async fn oncely_tenant(app: &TestApp, args: &[&str]) -> (i32, String, String) {
    let mut command = oncely_binary(&["tenant"]);
    command
        .args(args)
        .args(["--database-url", &app.database_url]);
    run_to_end(&mut command).await
}

/// `set acme --return-url CALLBACK --return-url <second>`, then `extra`.
fn callback_and<'a>(second: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "set",
        "acme",
        "--return-url",
        CALLBACK,
        "--return-url",
        second,
    ];
    args.extend(extra);
    args
}

/// The return URLs of the first tenant `tenant list --json` lists.
async fn return_urls(app: &TestApp) -> Value {
    let (_, out, _) = oncely_tenant(app, &["list", "--json"]).await;
    let list: Value = serde_json::from_str(&out).unwrap();
    list[0]["return_urls"].clone()
}

/// Tenant `name` with these return URLs; its API key.
async fn tenant_with_return_urls(app: &TestApp, name: &str, urls: &[&str]) -> String {
    let key = app.create_tenant(name).await;
    let mut args = vec!["set", name];
    for url in urls {
        args.extend(["--return-url", url]);
    }
    let (code, out, err) = oncely_tenant(app, &args).await;
    assert_eq!(code, 0, "{out}{err}");
    key
}

const ADA: &str = "ada@example.com";

/// The app, the tenant `acme` returning to [`CALLBACK`] (its API key), and Ada's signup through
/// acme.
async fn ada_signed_up(url: &str) -> (TestApp, String) {
    let app = app(url).await;
    let acme = tenant_with_return_urls(&app, "acme", &[CALLBACK]).await;
    app.post_as(&acme, "/v1/signup", "s1", &email(ADA)).await;
    (app, acme)
}

/// Uses the link in the `n`th email to `to` at `path` as a browser does (Idempotency-Key
/// `key`): its answer, which is a 200.
async fn use_nth_link(app: &TestApp, to: &str, n: usize, path: &str, key: &str) -> Value {
    let presented = token(&nth_token(app, to, n).await);
    let (status, body, _) = use_link(app, path, key, &presented).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// `to`'s verification link (the first email) used: what the page posts, and the code its
/// redirect to [`CALLBACK`] carries.
async fn verified_code(app: &TestApp, to: &str) -> (Value, String) {
    let presented = token(&nth_token(app, to, 1).await);
    let (_, body, _) = use_link(app, "/v1/verify", "v1", &presented).await;
    (presented, code_of(&body["redirect"], CALLBACK))
}

/// POST as a browser (no API key) with its own Idempotency-Key: (status, body, replayed).
async fn use_link(app: &TestApp, path: &str, key: &str, body: &Value) -> (u16, Value, bool) {
    let r = app.post(path, key, body).await;
    let replayed = r.headers().get("idempotent-replayed").is_some();
    (r.status().as_u16(), r.json().await.unwrap(), replayed)
}

/// The code of a redirect that must start with `return_to` and one of `?code=` / `&code=`.
fn code_of(redirect: &Value, return_to: &str) -> String {
    let redirect = redirect.as_str().expect("a redirect");
    let rest = redirect
        .strip_prefix(return_to)
        .unwrap_or_else(|| panic!("{redirect} does not start with {return_to}"));
    let code = rest
        .strip_prefix("?code=")
        .or_else(|| rest.strip_prefix("&code="))
        .unwrap_or_else(|| panic!("no code appended: {redirect}"));
    assert!(code.len() >= 22, "≥ 128 bits: {code}");
    assert!(
        code.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "{code}"
    );
    code.to_owned()
}

/// Every stored answer of the idempotency layer, as text.
async fn stored_answers(url: &str) -> Vec<String> {
    let sql = if url.starts_with("postgres") {
        "SELECT convert_from(coalesce(response_body, ''), 'UTF8') FROM oncely_idempotency_keys"
    } else {
        "SELECT CAST(coalesce(response_body, '') AS TEXT) FROM oncely_idempotency_keys"
    };
    crate::support::texts(url, sql).await
}

async fn exchange(app: &TestApp, api_key: &str, key: &str, code: &str) -> (u16, Value) {
    let r = app
        .post_as(api_key, "/v1/exchange", key, &json!({ "code": code }))
        .await;
    (r.status().as_u16(), r.json().await.unwrap())
}

/// Asserts the exchange answers this identity, and that the code then is spent.
async fn exchanges_once(app: &TestApp, api_key: &str, code: &str, who: &str, flow: &str) -> Value {
    let (status, identity) = exchange(app, api_key, &format!("x-{code}"), code).await;
    assert_eq!(status, 200, "{identity}");
    assert_eq!(identity["email"], who, "{identity}");
    assert_eq!(identity["flow"], flow, "{identity}");
    assert_eq!(identity["tenant"], "acme", "{identity}");
    assert_eq!(identity["email_verified"], true, "{identity}");
    let user_id = identity["user_id"].as_str().unwrap();
    let sql = format!(
        "SELECT count(*) FROM oncely_users WHERE email = '{who}' AND tenant = 'acme' AND {}",
        if app.database_url.starts_with("postgres") {
            format!("id = '{user_id}'")
        } else {
            let hex = user_id.replace('-', "");
            format!("hex(id) = upper('{hex}')")
        }
    );
    assert_counts(app, &[(sql.as_str(), 1)]).await;
    time::OffsetDateTime::parse(
        identity["authenticated_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .expect("authenticated_at is RFC 3339");
    let (again, problem) = exchange(app, api_key, &format!("y-{code}"), code).await;
    assert_eq!(
        (again, problem_type(&problem)),
        (400, "code-invalid"),
        "once"
    );
    identity
}

both_databases!(
    each_link_flow_returns_to_the_tenants_url_with_a_code_that_exchanges_once,
    an_email_change_returns_nowhere_even_where_the_tenant_has_return_urls,
    a_retried_use_replays_the_same_redirect_and_its_code_exchanges_once,
    concurrent_exchanges_of_one_code_give_exactly_one_identity,
    a_link_used_concurrently_with_one_key_mints_one_code,
    a_code_expires_after_60_seconds_and_is_pruned,
    a_code_of_tenant_a_is_invalid_with_tenant_bs_key_and_still_good_for_a,
    a_link_whose_return_url_was_removed_since_returns_nowhere,
    return_url_tricks_are_refused_before_anything_is_written,
    the_cli_sets_checks_lists_and_clears_return_urls,
    an_exchange_keyed_by_its_code_replays_only_while_the_code_lives,
);

/// A link requested without a return URL stores the tenant's first, which the token's insert
/// reads itself; an email change stores none, whatever the tenant has (the account is signed in
/// already: no code is minted).
async fn an_email_change_returns_nowhere_even_where_the_tenant_has_return_urls(
    url: String,
    _db: TestDb,
) {
    let app = app(&url).await;
    let acme = tenant_with_return_urls(&app, "acme", &[CALLBACK, LOCAL]).await;
    let ada = "ada@example.com";
    let signup = app.post_as(&acme, "/v1/signup", "s1", &email(ada)).await;
    assert_eq!(signup.status(), 202);
    let body = use_nth_link(&app, ada, 1, "/v1/verify", "v1").await;
    let identity = exchanges_once(
        &app,
        &acme,
        &code_of(&body["redirect"], CALLBACK),
        ada,
        "verification",
    )
    .await;
    let user_id = identity["user_id"].as_str().unwrap();
    let change = json!({ "new_email": "ada.new@example.com" });
    let path = format!("/v1/users/{user_id}/email-change");
    assert_eq!(app.post_as(&acme, &path, "c1", &change).await.status(), 202);
    let body = use_nth_link(
        &app,
        "ada.new@example.com",
        1,
        "/v1/email-change/confirm",
        "ec1",
    )
    .await;
    assert!(body.get("redirect").is_none(), "{body}");
    assert_counts(
        &app,
        &[
            (
                &format!("SELECT count(*) FROM oncely_tokens WHERE flow = 'verification' AND return_to = '{CALLBACK}'"),
                1,
            ),
            (
                "SELECT count(*) FROM oncely_tokens WHERE flow = 'email_change' AND return_to IS NULL",
                1,
            ),
            ("SELECT count(*) FROM oncely_codes WHERE consumed_at IS NULL", 0),
        ],
    )
    .await;
}

async fn each_link_flow_returns_to_the_tenants_url_with_a_code_that_exchanges_once(
    url: String,
    _db: TestDb,
) {
    let app = app(&url).await;
    let acme = tenant_with_return_urls(&app, "acme", &[CALLBACK, LOCAL]).await;
    let ada = "ada@example.com";

    // Signup without return_to: the tenant's first URL.
    let signup = json!({ "email": ada, "password": "correct horse battery" });
    assert_eq!(app.status_as(&acme, "/v1/signup", "s1", &signup).await, 202);
    let body = use_nth_link(&app, ada, 1, "/v1/verify", "v1").await;
    assert_eq!(body["status"], "verified");
    assert_eq!(body["password_set"], false);
    assert!(
        body.get("code_id").is_none() && body.get("return_to").is_none(),
        "{body}"
    );
    let code = code_of(&body["redirect"], CALLBACK);
    exchanges_once(&app, &acme, &code, ada, "verification").await;

    // Password reset and magic link, each asking for the second URL (its query kept).
    for (n, request, consume, flow, extra) in [
        (
            2,
            "/v1/password-reset",
            "/v1/password-reset/confirm",
            "password_reset",
            Some("a brand new password"),
        ),
        (
            3,
            "/v1/magic-link",
            "/v1/magic-link/consume",
            "magic_link",
            None,
        ),
    ] {
        let body = json!({ "email": ada, "return_to": LOCAL });
        let r = app.post_as(&acme, request, &format!("r{n}"), &body).await;
        assert_eq!(r.status(), 202, "{request}");
        let mut used = token(&nth_token(&app, ada, n).await);
        if let Some(password) = extra {
            used["password"] = json!(password);
        }
        // From another client address than the request's.
        let browser = client_from("127.0.0.2");
        let r = browser
            .post(format!("{}{consume}", app.base))
            .header("idempotency-key", format!("c{n}"))
            .json(&used)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{consume}");
        let body: Value = r.json().await.unwrap();
        let code = code_of(&body["redirect"], LOCAL);
        assert!(
            body["redirect"]
                .as_str()
                .unwrap()
                .contains("?from=mail&code="),
            "{body}"
        );
        exchanges_once(&app, &acme, &code, ada, flow).await;
    }

    // Resend of a pending account's verification.
    let bob = "bob@example.com";
    app.post_as(&acme, "/v1/signup", "s2", &email(bob)).await;
    nth_token(&app, bob, 1).await;
    let resend = json!({ "email": bob, "return_to": CALLBACK });
    assert_eq!(
        app.status_as(&acme, "/v1/verification/resend", "rs", &resend)
            .await,
        202
    );
    let body = use_nth_link(&app, bob, 2, "/v1/verify", "v2").await;
    let code = code_of(&body["redirect"], CALLBACK);
    exchanges_once(&app, &acme, &code, bob, "verification").await;

    // Invite: the invited address, verified, a member.
    let guest = "guest@example.com";
    let invite = json!({ "email": guest, "return_to": LOCAL });
    assert_eq!(
        app.status_as(&acme, "/v1/invites", "i1", &invite).await,
        202
    );
    let body = use_nth_link(&app, guest, 1, "/v1/invites/accept", "a1").await;
    assert_eq!(body["status"], "joined", "{body}");
    let code = code_of(&body["redirect"], LOCAL);
    exchanges_once(&app, &acme, &code, guest, "invite").await;
    assert_counts(
        &app,
        &[(
            "SELECT count(*) FROM oncely_codes WHERE consumed_at IS NULL",
            0,
        )],
    )
    .await;
}

async fn a_retried_use_replays_the_same_redirect_and_its_code_exchanges_once(
    url: String,
    _db: TestDb,
) {
    let (app, acme) = ada_signed_up(&url).await;
    let ada = ADA;
    let presented = token(&nth_token(&app, ada, 1).await);
    let (_, first, replayed) = use_link(&app, "/v1/verify", "v1", &presented).await;
    assert!(!replayed);
    let (status, again, replayed) = use_link(&app, "/v1/verify", "v1", &presented).await;
    assert_eq!(status, 200);
    assert!(replayed, "the retry is the stored answer");
    assert_eq!(first, again, "the same redirect");
    let code = code_of(&first["redirect"], CALLBACK);
    assert_counts(&app, &[("SELECT count(*) FROM oncely_codes", 1)]).await;

    // The code is in no table in clear: not in the codes table, not in the stored answer (which
    // holds the code's id, useless without the server secret).
    let database = dump(&url).await;
    assert!(
        database.contains("auth/callback"),
        "the dump covers the tokens"
    );
    assert!(
        !database.contains(&code),
        "the code in clear in the database"
    );
    let stored = stored_answers(&url).await;
    assert!(
        stored.iter().any(|answer| answer.contains("\"code_id\"")),
        "{stored:?}"
    );
    assert!(
        stored.iter().all(|answer| !answer.contains(&code)),
        "the code in a stored answer: {stored:?}"
    );

    // Retried exchange with one key: the same identity, replayed; a new key: spent.
    let (status, identity) = exchange(&app, &acme, "x1", &code).await;
    assert_eq!(status, 200, "{identity}");
    let retry = app
        .post_as(&acme, "/v1/exchange", "x1", &json!({ "code": code }))
        .await;
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.json::<Value>().await.unwrap(), identity);
    assert_eq!(identity["email"], ada);
    let stored = stored_answers(&url).await;
    assert!(
        stored.iter().any(|answer| answer.contains("\"user_id\"")),
        "the identity is stored: {stored:?}"
    );
    assert!(
        stored.iter().all(|answer| !answer.contains(ada)),
        "an address in a stored answer: {stored:?}"
    );
    let (status, problem) = exchange(&app, &acme, "x2", &code).await;
    assert_eq!((status, problem_type(&problem)), (400, "code-invalid"));
    // A replay of the link's answer after the exchange still carries the spent code.
    let (_, late, _) = use_link(&app, "/v1/verify", "v1", &presented).await;
    assert_eq!(late, first);
    let (status, _) = exchange(&app, &acme, "x3", &code).await;
    assert_eq!(status, 400);
}

async fn concurrent_exchanges_of_one_code_give_exactly_one_identity(url: String, _db: TestDb) {
    let (app, acme) = ada_signed_up(&url).await;
    let ada = ADA;
    let (_, code) = verified_code(&app, ada).await;
    let n = 12;
    let keys: Vec<String> = (0..n).map(|i| format!("x{i}")).collect();
    let answers =
        futures::future::join_all(keys.iter().map(|key| exchange(&app, &acme, key, &code))).await;
    let ok = answers.iter().filter(|(s, _)| *s == 200).count();
    let invalid = answers
        .iter()
        .filter(|(s, b)| *s == 400 && problem_type(b) == "code-invalid")
        .count();
    assert_eq!((ok, invalid), (1, n - 1), "{answers:?}");
}

async fn a_link_used_concurrently_with_one_key_mints_one_code(url: String, _db: TestDb) {
    let (app, acme) = ada_signed_up(&url).await;
    let ada = ADA;
    // The signup's email first: sent at once, the two could arrive in either order.
    nth_token(&app, ada, 1).await;
    let body = json!({ "email": ada, "return_to": CALLBACK });
    app.post_as(&acme, "/v1/magic-link", "m1", &body).await;
    let presented = token(&nth_token(&app, ada, 2).await);
    let answers = futures::future::join_all(
        (0..8).map(|_| use_link(&app, "/v1/magic-link/consume", "c1", &presented)),
    )
    .await;
    // Each is the answer or its replay (or, past the wait for the first, 409 to retry).
    let redirects: std::collections::BTreeSet<String> = answers
        .iter()
        .filter(|(status, _, _)| *status == 200)
        .map(|(_, body, _)| body["redirect"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        answers
            .iter()
            .all(|(status, _, _)| [200, 409].contains(status)),
        "{answers:?}"
    );
    assert_eq!(redirects.len(), 1, "one redirect: {answers:?}");
    assert_counts(&app, &[("SELECT count(*) FROM oncely_codes", 1)]).await;
    let code = code_of(&json!(redirects.first().unwrap()), CALLBACK);
    exchanges_once(&app, &acme, &code, ada, "magic_link").await;
}

/// Every code of the database as if its 60 s had passed.
async fn expire_codes(url: &str) {
    let past = if url.starts_with("postgres") {
        "now() - interval '1 second'"
    } else {
        "CAST(strftime('%s', 'now') AS INTEGER) * 1000 - 1000"
    };
    execute(url, &format!("UPDATE oncely_codes SET expires_at = {past}")).await;
}

async fn a_code_expires_after_60_seconds_and_is_pruned(url: String, _db: TestDb) {
    let (app, acme) = ada_signed_up(&url).await;
    let ada = ADA;
    let (_, code) = verified_code(&app, ada).await;
    let postgres = url.starts_with("postgres");
    // Bound at the link's use: 60 s, authenticated when the token was consumed.
    let lifetime = if postgres {
        "SELECT count(*) FROM oncely_codes c JOIN oncely_tokens t ON t.user_id = c.user_id
          WHERE c.expires_at - c.authenticated_at = interval '60 seconds'
            AND c.authenticated_at = t.consumed_at AND c.flow = 'verification'
            AND c.tenant = 'acme'"
    } else {
        "SELECT count(*) FROM oncely_codes c JOIN oncely_tokens t ON t.user_id = c.user_id
          WHERE c.expires_at - c.authenticated_at = 60000
            AND c.authenticated_at = t.consumed_at AND c.flow = 'verification'
            AND c.tenant = 'acme'"
    };
    assert_counts(&app, &[(lifetime, 1)]).await;
    // As if its 60 s had passed.
    expire_codes(&url).await;
    let (status, problem) = exchange(&app, &acme, "x1", &code).await;
    assert_eq!((status, problem_type(&problem)), (400, "code-invalid"));
    let unknown = exchange(
        &app,
        &acme,
        "x2",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    )
    .await;
    let malformed = exchange(&app, &acme, "x3", "not a code\n%0a").await;
    assert_eq!(
        unknown,
        (status, problem.clone()),
        "unknown and expired alike"
    );
    assert_eq!(malformed, (status, problem), "malformed and expired alike");

    let (pruned, output) = crate::ops::oncely(&["prune", "--database-url", &url]).await;
    assert!(pruned, "{output}");
    assert_counts(&app, &[("SELECT count(*) FROM oncely_codes", 0)]).await;
}

async fn a_code_of_tenant_a_is_invalid_with_tenant_bs_key_and_still_good_for_a(
    url: String,
    _db: TestDb,
) {
    let app = app(&url).await;
    let acme = tenant_with_return_urls(&app, "acme", &[CALLBACK]).await;
    let other = tenant_with_return_urls(&app, "other", &[CALLBACK]).await;
    let ada = "ada@example.com";
    app.post_as(&acme, "/v1/signup", "s1", &email(ada)).await;
    let (_, code) = verified_code(&app, ada).await;

    let (status, problem) = exchange(&app, &other, "x1", &code).await;
    assert_eq!((status, problem_type(&problem)), (400, "code-invalid"));
    // No key, or a bad one: 401, the code untouched.
    let anonymous = app
        .post("/v1/exchange", "x2", &json!({ "code": code }))
        .await;
    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    let (status, _) = exchange(&app, "onc_not-a-key", "x3", &code).await;
    assert_eq!(status, 401);
    exchanges_once(&app, &acme, &code, ada, "verification").await;
    // The Idempotency-Key tenant other used is, in tenant acme, a request of its own.
    let (status, identity) = exchange(&app, &acme, "x1", &code).await;
    assert_eq!(status, 400, "spent: {identity}");
}

/// A return URL the operator removed (a domain given up, or compromised) is no longer returned
/// to, even by links sent while it was allowed: the link still works, without a code.
async fn a_link_whose_return_url_was_removed_since_returns_nowhere(url: String, _db: TestDb) {
    let app = app(&url).await;
    let acme = tenant_with_return_urls(&app, "acme", &[CALLBACK, LOCAL]).await;
    let ada = "ada@example.com";
    let signup = json!({ "email": ada, "return_to": LOCAL });
    assert_eq!(app.status_as(&acme, "/v1/signup", "s1", &signup).await, 202);
    let presented = token(&nth_token(&app, ada, 1).await);
    // Bob's link is used while the URL is listed: a redirect, its answer stored.
    let bob = "bob@example.com";
    let signup = json!({ "email": bob, "return_to": LOCAL });
    app.post_as(&acme, "/v1/signup", "s2", &signup).await;
    let bobs = token(&nth_token(&app, bob, 1).await);
    let (status, body, _) = use_link(&app, "/v1/verify", "b1", &bobs).await;
    assert_eq!(status, 200, "{body}");
    code_of(&body["redirect"], LOCAL);

    let (code, out, err) = oncely_tenant(&app, &["set", "acme", "--return-url", CALLBACK]).await;
    assert_eq!(code, 0, "{out}{err}");

    let (status, body, _) = use_link(&app, "/v1/verify", "v1", &presented).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "verified");
    assert!(body.get("redirect").is_none(), "{body}");
    assert_counts(&app, &[("SELECT count(*) FROM oncely_codes", 1)]).await;
    // Second review: a replay of Bob's answer still sent the browser to the removed URL.
    let (status, body, replayed) = use_link(&app, "/v1/verify", "b1", &bobs).await;
    assert_eq!((status, replayed), (200, true), "{body}");
    assert_eq!(body, json!({ "status": "verified", "password_set": false }));
}

/// Return URLs that are not the tenant's byte for byte: each refused with 400
/// `return-url-not-allowed` on every flow request, nothing written.
const TRICKS: &[&str] = &[
    "http://app.example.com/auth/callback",
    "https://app.example.com/auth/callback/",
    "https://app.example.com/auth/callback#x",
    "https://app.example.com/auth/callback?x=1",
    "https://APP.example.com/auth/callback",
    "https://app.example.com/AUTH/callback",
    "https://app.example.com:443/auth/callback",
    "https://app.example.com:8443/auth/callback",
    "https://app.example.com@evil.com/auth/callback",
    "https://evil.com/auth/callback",
    "https://app.example.com.evil.com/auth/callback",
    "https://app.example.com/auth/../evil",
    "https://app.example.com/auth/%2e%2e/evil",
    "https://app.example.com/auth/callback%0a",
    "https://app.example.com/auth/callback%0d%0aSet-Cookie:x=1",
    "https://app.example.com/auth/%63allback",
    "https://app.example.com/auth/callback ",
    " https://app.example.com/auth/callback",
    "//app.example.com/auth/callback",
    "/auth/callback",
    "javascript:alert(1)//https://app.example.com/auth/callback",
    "",
];

async fn return_url_tricks_are_refused_before_anything_is_written(url: String, _db: TestDb) {
    let app = app(&url).await;
    let acme = tenant_with_return_urls(&app, "acme", &[CALLBACK]).await;
    // A tenant without return URLs, and the default tenant: any return_to is refused.
    let bare = app.create_tenant("bare").await;
    let ada = "ada@example.com";
    let nothing_written = [
        ("SELECT count(*) FROM oncely_users", 0),
        ("SELECT count(*) FROM oncely_tokens", 0),
        ("SELECT count(*) FROM oncely_outbox", 0),
        ("SELECT count(*) FROM oncely_idempotency_keys", 0),
    ];
    let paths = [
        "/v1/signup",
        "/v1/verification/resend",
        "/v1/password-reset",
        "/v1/magic-link",
        "/v1/invites",
    ];
    let mut n = 0;
    for trick in TRICKS {
        for path in paths {
            n += 1;
            let body = json!({ "email": ada, "return_to": trick });
            let r = app.post_as(&acme, path, &format!("t{n}"), &body).await;
            assert_eq!(r.status(), 400, "{path} {trick:?}");
            let problem: Value = r.json().await.unwrap();
            assert_eq!(
                problem_type(&problem),
                "return-url-not-allowed",
                "{path} {trick:?}"
            );
        }
    }
    for path in paths {
        n += 1;
        let body = json!({ "email": ada, "return_to": CALLBACK });
        let r = app.post_as(&bare, path, &format!("t{n}"), &body).await;
        assert_eq!(r.status(), 400, "a tenant without return URLs: {path}");
        if path != "/v1/invites" {
            let r = app.post(path, &format!("d{n}"), &body).await;
            assert_eq!(r.status(), 400, "the default tenant: {path}");
        }
    }
    assert_counts(&app, &nothing_written).await;

    // The exact URL works; an address without an account gets a decoy with the same URL.
    let body = json!({ "email": "nobody@example.com", "return_to": CALLBACK });
    let r = app.post_as(&acme, "/v1/magic-link", "ok", &body).await;
    assert_eq!(r.status(), 202);
    let decoy = format!(
        "SELECT count(*) FROM oncely_tokens WHERE user_id IS NULL AND return_to = '{CALLBACK}'"
    );
    assert_counts(&app, &[(decoy.as_str(), 1)]).await;
}

async fn the_cli_sets_checks_lists_and_clears_return_urls(url: String, _db: TestDb) {
    let app = app(&url).await;
    app.create_tenant("acme").await;
    // Each refused, with a one-line reason; the canonical form where it differs.
    for (given, says) in [
        ("http://app.example.com/cb", "use https"),
        ("ftp://app.example.com/cb", "use https"),
        ("javascript:alert(1)", "use https"),
        ("/auth/callback", "not an absolute URL"),
        ("https://app.example.com@evil.com/cb", "user information"),
        ("https://app.example.com/cb#x", "fragment"),
        ("https://app.example.com/cb%0a", "control character"),
        ("https://app.example.com/cb%0D%0A", "control character"),
        (
            "https://APP.example.com/cb",
            "write it as https://app.example.com/cb",
        ),
        (
            "https://app.example.com:443/cb",
            "write it as https://app.example.com/cb",
        ),
        (
            "https://app.example.com/auth/../evil",
            "write it as https://app.example.com/evil",
        ),
        (
            "https://app.example.com/auth/%2e%2e/evil",
            "write it as https://app.example.com/evil",
        ),
        (
            "https://app.example.com",
            "write it as https://app.example.com/",
        ),
    ] {
        let (code, out, err) = oncely_tenant(&app, &callback_and(given, &[])).await;
        assert_eq!(code, 1, "{given}: {out}{err}");
        assert!(err.contains(says), "{given}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    assert_counts(&app, &[("SELECT count(*) FROM oncely_return_urls", 0)]).await;

    let (code, _, err) = oncely_tenant(&app, &["set", "default", "--return-url", CALLBACK]).await;
    assert_eq!(code, 1);
    assert!(err.contains("no API key"), "{err}");
    let (code, _, err) = oncely_tenant(&app, &["set", "nobody", "--return-url", CALLBACK]).await;
    let (rotate, _, rotate_err) = oncely_tenant(&app, &["rotate-key", "nobody"]).await;
    assert_eq!(
        (code, err.as_str()),
        (rotate, rotate_err.as_str()),
        "as rotate-key"
    );
    assert_eq!(code, 3);
    let (code, _, err) = oncely_tenant(&app, &["set", "acme"]).await;
    assert_eq!(code, 2, "a list or --no-return-urls: {err}");

    let (code, out, err) = oncely_tenant(&app, &callback_and(LOCAL, &["--json"])).await;
    assert_eq!(code, 0, "{err}");
    let set: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        set,
        json!({ "tenant": "acme", "return_urls": [CALLBACK, LOCAL] })
    );
    assert_eq!(return_urls(&app).await, json!([CALLBACK, LOCAL]));
    let (_, out, _) = oncely_tenant(&app, &["list"]).await;
    assert!(out.lines().next().unwrap().contains("return URLs"), "{out}");
    assert!(out.contains(&format!("{CALLBACK} {LOCAL}")), "{out}");
    // Replaced, in the new order.
    oncely_tenant(&app, &["set", "acme", "--return-url", LOCAL]).await;
    assert_eq!(return_urls(&app).await, json!([LOCAL]));

    let (code, out, _) = oncely_tenant(&app, &["set", "acme", "--no-return-urls"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("no return URLs"), "{out}");
    assert_eq!(return_urls(&app).await, json!([]));
}

/// A backend that derives the exchange's Idempotency-Key from the code (a callback that may be
/// reloaded) gets the identity again while the code would still be good — and `code-invalid`
/// once its 60 s are over: a spent code is no bearer for the key's 24 h retention.
async fn an_exchange_keyed_by_its_code_replays_only_while_the_code_lives(url: String, _db: TestDb) {
    let (app, acme) = ada_signed_up(&url).await;
    let ada = ADA;
    let (_, code) = verified_code(&app, ada).await;
    let key = format!("exchange-{code}");
    let (status, identity) = exchange(&app, &acme, &key, &code).await;
    assert_eq!(status, 200, "{identity}");
    let reloaded = app
        .post_as(&acme, "/v1/exchange", &key, &json!({ "code": code }))
        .await;
    assert_eq!(reloaded.status(), 200);
    assert_eq!(reloaded.headers()["idempotent-replayed"], "true");
    assert_eq!(reloaded.json::<Value>().await.unwrap(), identity);
    // As if its 60 s had passed: the same key, the same body, now refused.
    expire_codes(&url).await;
    for _ in 0..2 {
        let (status, problem) = exchange(&app, &acme, &key, &code).await;
        assert_eq!(
            (status, problem_type(&problem)),
            (400, "code-invalid"),
            "{problem}"
        );
        assert!(problem.get("user_id").is_none());
    }
    // Another tenant's key never learns whether the code lived.
    let other = tenant_with_return_urls(&app, "other", &[CALLBACK]).await;
    let (status, problem) = exchange(&app, &other, &key, &code).await;
    assert_eq!((status, problem_type(&problem)), (400, "code-invalid"));
}
