//! `POST /v1/login` as its users and its attackers would call it, on a tenant of its own:
//! identities replayed with a key and not without, one 401 for every failure (same status,
//! body, headers and time), failures throttled per address and client without locking the
//! owner out, and hashes of older parameters upgraded on the way.

use std::time::{Duration, Instant};

use oncely_server::limits::login::LoginLimits;
use oncely_testdb::TestDb;
use serde_json::{Value, json};

use crate::flows::{mann_whitney_z, median};
use crate::requests::{email, nth_token, problem_type};
use crate::support::{TestApp, both_databases, execute, spawn_app_on};

both_databases!(
    a_verified_account_logs_in_with_or_without_a_key_and_every_failure_is_one_401,
    a_failed_login_takes_as_long_whether_or_not_the_address_has_an_account,
    a_strangers_failures_refuse_its_own_client_never_the_owner,
    a_backend_that_forwards_no_client_address_is_not_one_client,
    new_clients_together_stop_at_the_hard_ceiling,
    concurrent_failures_cannot_slip_under_the_limit,
    a_hash_of_other_parameters_is_upgraded_at_login,
);

const PASSWORD: &str = "correct horse battery";

/// Limits no test of the flow itself reaches.
const GENEROUS: LoginLimits = LoginLimits {
    per_address: 1000,
    per_address_total: 1000,
    per_client: 1000,
    window: Duration::from_secs(900),
};

/// The app with these login limits, and the API key of its tenant `acme`.
async fn app(url: &str, limits: LoginLimits) -> (TestApp, String) {
    let app = spawn_app_on(url, |s| {
        s.login = limits;
        s.limits.per_address = 100;
        s.limits.per_client = 1000;
    })
    .await;
    let acme = app.create_tenant("acme").await;
    (app, acme)
}

/// An account of `acme`: signed up (with `password`, if any) and, if `verify`, verified with
/// the password re-entered (so adopted).
async fn account(app: &TestApp, acme: &str, address: &str, password: Option<&str>, verify: bool) {
    let body = with_password(email(address), password);
    let signup = format!("signup-{address}");
    assert_eq!(app.status_as(acme, "/v1/signup", &signup, &body).await, 202);
    if !verify {
        return;
    }
    let confirm = json!({ "token": nth_token(app, address, 1).await });
    let confirm = with_password(confirm, password);
    let verify = format!("verify-{address}");
    assert_eq!(
        app.status_as(acme, "/v1/verify", &verify, &confirm).await,
        200
    );
}

/// `body` with `"password"`, if any.
fn with_password(mut body: Value, password: Option<&str>) -> Value {
    if let Some(password) = password {
        body["password"] = json!(password);
    }
    body
}

/// A login the application's backend sends for the person at `client` (its address in
/// `Oncely-Client-IP`, if given): the tenant's API key if given, an Idempotency-Key if given; a
/// `503 busy` (the hashing pool, shared by the tests running at once) is retried, a bounded
/// number of times, as a client would. Every request comes from the one backend address.
async fn login_from(
    client: Option<&str>,
    app: &TestApp,
    api_key: Option<&str>,
    key: Option<&str>,
    address: &str,
    password: &str,
) -> reqwest::Response {
    for _ in 0..100 {
        let mut request = app
            .client
            .post(format!("{}/v1/login", app.base))
            .json(&json!({ "email": address, "password": password }));
        if let Some(client) = client {
            request = request.header("oncely-client-ip", client);
        }
        if let Some(api_key) = api_key {
            request = request.bearer_auth(api_key);
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await.unwrap();
        if response.status() != 503 {
            return response;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the hashing pool stayed busy");
}

async fn login(
    app: &TestApp,
    acme: &str,
    key: Option<&str>,
    address: &str,
    password: &str,
) -> reqwest::Response {
    login_from(None, app, Some(acme), key, address, password).await
}

/// Status, headers (but those that differ between any two responses) and body.
async fn answer(response: reqwest::Response) -> (u16, Vec<(String, String)>, String) {
    let mut headers: Vec<_> = response
        .headers()
        .iter()
        .filter(|(name, _)| !["date", "x-request-id", "retry-after"].contains(&name.as_str()))
        .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
        .collect();
    headers.sort();
    let status = response.status().as_u16();
    (status, headers, response.text().await.unwrap())
}

/// The `Retry-After` of a 429, checked to be within the window.
fn retry_after(response: &reqwest::Response, window: Duration) -> u64 {
    let seconds: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=window.as_secs()).contains(&seconds), "{seconds}");
    seconds
}

async fn a_verified_account_logs_in_with_or_without_a_key_and_every_failure_is_one_401(
    url: String,
    _db: TestDb,
) {
    let (app, acme) = app(&url, GENEROUS).await;
    account(&app, &acme, "ada@example.com", Some(PASSWORD), true).await;
    account(&app, &acme, "nopass@example.com", None, true).await;
    account(&app, &acme, "pending@example.com", Some(PASSWORD), false).await;

    let first = login(&app, &acme, Some("l1"), " Ada@Example.com ", PASSWORD).await;
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first = first.text().await.unwrap();
    let identity: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(identity["email"], "ada@example.com");
    assert_eq!(identity["tenant"], "acme");
    assert_eq!(identity["flow"], "password");
    assert_eq!(identity["email_verified"], true);
    assert!(identity["user_id"].as_str().unwrap().len() == 36);
    assert!(
        identity["authenticated_at"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );

    // With a key: retried and concurrent, one identity replayed.
    let again = login(&app, &acme, Some("l1"), "ada@example.com", PASSWORD).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await.unwrap(), first);
    let at_once = futures::future::join_all(
        (0..4).map(|_| login(&app, &acme, Some("l2"), "ada@example.com", PASSWORD)),
    )
    .await;
    // The key contract (api.md): a request whose key is still running waits up to 1.5 s, then
    // replays — or answers 409 `idempotency-key-in-use` with Retry-After (a loaded machine's
    // Argon2 check can outlast the wait). Never a second sign-in.
    let mut bodies = Vec::new();
    for response in at_once {
        match response.status().as_u16() {
            200 => bodies.push(response.text().await.unwrap()),
            409 => assert_eq!(response.headers()["retry-after"], "1"),
            other => panic!("{other}: {}", response.text().await.unwrap()),
        }
    }
    let retried = login(&app, &acme, Some("l2"), "ada@example.com", PASSWORD).await;
    assert_eq!(retried.status(), 200);
    bodies.push(retried.text().await.unwrap());
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "one identity per key"
    );
    // Without a key: each request runs.
    let unkeyed = futures::future::join_all(
        (0..4).map(|_| login(&app, &acme, None, "ada@example.com", PASSWORD)),
    )
    .await;
    for response in unkeyed {
        assert_eq!(response.status(), 200);
        assert!(response.headers().get("idempotent-replayed").is_none());
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["user_id"], identity["user_id"]);
    }

    // Every failure is the same answer.
    let failures = [
        ("nobody@example.com", PASSWORD, "unknown address"),
        ("not an address", PASSWORD, "unparseable address"),
        ("ada@example.com", "not the password", "wrong password"),
        ("nopass@example.com", PASSWORD, "account without a password"),
        ("pending@example.com", PASSWORD, "account not verified"),
    ];
    let mut answers = Vec::new();
    for (i, (address, password, what)) in failures.into_iter().enumerate() {
        let response = login(&app, &acme, Some(&format!("f{i}")), address, password).await;
        let answer = answer(response).await;
        assert_eq!(answer.0, 401, "{what}");
        answers.push((what, answer));
    }
    for (what, answer) in &answers {
        assert_eq!(*answer, answers[0].1, "{what} vs {}", answers[0].0);
    }
    let problem: Value = serde_json::from_str(&answers[0].1.2).unwrap();
    assert_eq!(problem_type(&problem), "login-failed");
    // A failure is not stored: the same key runs again.
    let retried = login(
        &app,
        &acme,
        Some("f2"),
        "ada@example.com",
        "not the password",
    )
    .await;
    assert_eq!(retried.status(), 401);
    assert!(retried.headers().get("idempotent-replayed").is_none());

    // The default tenant has no key: no login. Another tenant's key does not open acme's account.
    let anonymous = login_from(None, &app, None, None, "ada@example.com", PASSWORD).await;
    assert_eq!(anonymous.status(), 401);
    let anonymous: Value = anonymous.json().await.unwrap();
    assert_eq!(problem_type(&anonymous), "unauthorized");
    let other = app.create_tenant("other").await;
    let elsewhere = login(&app, &other, Some("o1"), "ada@example.com", PASSWORD).await;
    assert_eq!(answer(elsewhere).await, answers[0].1);
    // Unknown fields are refused before anything.
    let extra = app
        .client
        .post(format!("{}/v1/login", app.base))
        .bearer_auth(&acme)
        .json(&json!({ "email": "ada@example.com", "password": PASSWORD, "admin": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(extra.status(), 400);
}

/// Each failure costs one Argon2 check, whether the address has an account with a password,
/// one without, or none: the response-time samples do not differ systematically
/// (Mann-Whitney U, |z| < 4, as the enumeration test of the email flows).
async fn a_failed_login_takes_as_long_whether_or_not_the_address_has_an_account(
    url: String,
    _db: TestDb,
) {
    let (app, acme) = app(&url, GENEROUS).await;
    account(&app, &acme, "known@example.com", Some(PASSWORD), true).await;
    account(&app, &acme, "nopass@example.com", None, true).await;
    let addresses = [
        "known@example.com",
        "nobody@example.com",
        "nopass@example.com",
    ];
    let mut samples = [Vec::new(), Vec::new(), Vec::new()];
    for i in 0..40 {
        for (address, sample) in addresses.iter().zip(samples.iter_mut()) {
            let started = Instant::now();
            let r = login(&app, &acme, None, address, &format!("wrong {i}")).await;
            sample.push(started.elapsed());
            assert_eq!(r.status(), 401);
        }
    }
    for (other, name) in [(&samples[1], "unknown"), (&samples[2], "no password")] {
        let z = mann_whitney_z(&samples[0], other);
        assert!(
            z.abs() < 4.0,
            "known vs {name}: response times differ systematically (z = {z:.2}): {:?} vs {:?}",
            median(&samples[0]),
            median(other)
        );
    }
}

/// Login caps: failures per client and address, per address in all, per client; 15 minutes.
fn limits(per_address: u32, per_address_total: u32, per_client: u32) -> LoginLimits {
    LoginLimits {
        per_address,
        per_address_total,
        per_client,
        window: Duration::from_secs(900),
    }
}

/// [`app`] with `limits`, and a verified account of acme at `address` with [`PASSWORD`].
async fn app_with_account(url: &str, limits: LoginLimits, address: &str) -> (TestApp, String) {
    let (app, acme) = app(url, limits).await;
    account(&app, &acme, address, Some(PASSWORD), true).await;
    (app, acme)
}

async fn a_strangers_failures_refuse_its_own_client_never_the_owner(url: String, _db: TestDb) {
    let limits = limits(3, 6, 8);
    let victim = "victim@example.com";
    let (app, acme) = app_with_account(&url, limits, victim).await;
    let stranger = Some("127.0.0.2");
    let owner = Some("127.0.0.3");
    let attempt = async |client: Option<&str>, address: &str, password: &str| {
        login_from(client, &app, Some(&acme), None, address, password).await
    };

    // The stranger's client: three failures per address, then 429 before any check — the same
    // for the victim's address and an unknown one, and even with the right password.
    let mut refusals = Vec::new();
    for address in [victim, "nobody@example.com"] {
        for _ in 0..limits.per_address {
            assert_eq!(attempt(stranger, address, "guess").await.status(), 401);
        }
        let refused = attempt(stranger, address, "guess").await;
        assert_eq!(refused.status(), 429, "{address}");
        retry_after(&refused, limits.window);
        refusals.push(answer(refused).await);
    }
    assert_eq!(refusals[0], refusals[1], "known and unknown refused alike");
    let problem: Value = serde_json::from_str(&refusals[0].2).unwrap();
    assert_eq!(problem_type(&problem), "login-throttled");
    assert_eq!(attempt(stranger, victim, PASSWORD).await.status(), 429);
    // The owner's client is not the stranger's.
    assert_eq!(attempt(owner, victim, PASSWORD).await.status(), 200);

    // Another stranger fills the address's total (3 + 3 = 6 failures).
    let second = Some("127.0.0.4");
    for _ in 0..limits.per_address {
        assert_eq!(attempt(second, victim, "guess").await.status(), 401);
    }
    // Over the total, a client with failures of its own at the address is refused after its
    // first attempt; a client with none — the owner's — still gets its attempt.
    let third = Some("127.0.0.5");
    assert_eq!(attempt(third, victim, "guess").await.status(), 401);
    assert_eq!(attempt(third, victim, PASSWORD).await.status(), 429);
    assert_eq!(attempt(owner, victim, PASSWORD).await.status(), 200);
    let travelling = Some("127.0.0.6");
    assert_eq!(attempt(travelling, victim, PASSWORD).await.status(), 200);

    // One client trying many addresses (credential stuffing) is stopped by its own cap.
    let stuffer = Some("127.0.0.7");
    for i in 0..limits.per_client {
        let address = format!("user{i}@example.com");
        assert_eq!(attempt(stuffer, &address, "guess").await.status(), 401);
    }
    let refused = attempt(stuffer, "user-next@example.com", "guess").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(answer(refused).await, refusals[0]);

    // The counters are keyed hashes: no address, local part or client in the table.
    let buckets = bucket_names(&url).await;
    assert!(buckets.iter().any(|b| b.starts_with("login-address:")));
    for bucket in &buckets {
        for needle in ["victim", "nobody", "user", "example", "127.0.0"] {
            assert!(!bucket.contains(needle), "{bucket} holds {needle}");
        }
    }
}

/// Review of issue 16: the caps counted the peer — for a login, the application's backend,
/// which all its users share — so six failures from one stranger refused the owner, and a
/// hundred on made-up addresses refused every user of the tenant. Without `Oncely-Client-IP`
/// the client is unknown: only the per-address total applies. A header that is not one address
/// is a 400, never silently the backend.
async fn a_backend_that_forwards_no_client_address_is_not_one_client(url: String, _db: TestDb) {
    let limits = limits(3, 6, 8);
    let victim = "victim@example.com";
    let (app, acme) = app_with_account(&url, limits, victim).await;
    let through_backend = async |address: &str, password: &str| {
        login(&app, &acme, None, address, password)
            .await
            .status()
            .as_u16()
    };
    // Credential stuffing through the backend, past what one client may: nobody else refused.
    for i in 0..=limits.per_client {
        let address = format!("user{i}@example.com");
        assert_eq!(through_backend(&address, "guess").await, 401);
    }
    // Guesses at the victim's address past the per-client-per-address cap, under the total.
    for _ in 0..limits.per_address_total - 1 {
        assert_eq!(through_backend(victim, "guess").await, 401);
    }
    assert_eq!(through_backend(victim, PASSWORD).await, 200);
    // The total still holds for the address (the one cap left when no client is named).
    assert_eq!(through_backend(victim, "guess").await, 401);
    assert_eq!(through_backend(victim, PASSWORD).await, 429);

    for bad in ["not-an-ip", "127.0.0.1, 127.0.0.2", ""] {
        let refused = login_from(Some(bad), &app, Some(&acme), None, victim, PASSWORD).await;
        assert_eq!(refused.status(), 400, "{bad:?}");
    }
    let twice = app
        .client
        .post(format!("{}/v1/login", app.base))
        .bearer_auth(&acme)
        .header("oncely-client-ip", "127.0.0.2")
        .header("oncely-client-ip", "127.0.0.3")
        .json(&json!({ "email": victim, "password": PASSWORD }))
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), 400);
}

/// Second review of issue 16: a client's first attempt passes the per-address total (so that
/// strangers cannot lock the owner out), and clients are cheap — an IPv6 prefix holds
/// thousands, a backend may name any address — so twelve guesses from twelve addresses were
/// all checked against a total of four. No address takes more than twice its total.
async fn new_clients_together_stop_at_the_hard_ceiling(url: String, _db: TestDb) {
    let limits = limits(3, 6, 100);
    let (app, acme) = app_with_account(&url, limits, "ada@example.com").await;
    let mut checked = 0;
    for i in 1..=20 {
        let client = format!("198.51.100.{i}");
        let status = login_from(
            Some(&client),
            &app,
            Some(&acme),
            None,
            "ada@example.com",
            "guess",
        )
        .await
        .status()
        .as_u16();
        assert!([401, 429].contains(&status), "{status}");
        checked += usize::from(status == 401);
    }
    assert_eq!(checked, 12, "twice the total, then nobody");
}

/// Every bucket of the limits table.
async fn bucket_names(url: &str) -> Vec<String> {
    crate::support::texts(url, "SELECT bucket FROM oncely_rate_limits").await
}

/// An attempt is counted before its password is checked: many at once from one client get no
/// more checks than the limit allows.
async fn concurrent_failures_cannot_slip_under_the_limit(url: String, _db: TestDb) {
    let limits = limits(3, 100, 100);
    let (app, acme) = app_with_account(&url, limits, "ada@example.com").await;
    let attacker = Some("127.0.0.2");
    let guesses = (0..12).map(|i| {
        let password = format!("guess {i}");
        let (attacker, app, acme) = (&attacker, &app, &acme);
        async move {
            login_from(
                *attacker,
                app,
                Some(acme),
                None,
                "ada@example.com",
                &password,
            )
            .await
            .status()
            .as_u16()
        }
    });
    let statuses = futures::future::join_all(guesses).await;
    let checked = statuses.iter().filter(|s| **s == 401).count();
    assert!(
        statuses.iter().all(|s| [401, 429].contains(s)),
        "{statuses:?}"
    );
    assert!(checked <= 3, "{checked} guesses checked: {statuses:?}");
    // However the race went, no more than the limit is ever checked in the window.
    let mut more = 0;
    while attempt_status(&app, attacker, &acme).await == 401 {
        more += 1;
        assert!(checked + more <= 3, "more checks than the limit");
    }
    assert_eq!(checked + more, 3);
}

async fn attempt_status(app: &TestApp, client: Option<&str>, acme: &str) -> u16 {
    login_from(client, app, Some(acme), None, "ada@example.com", "one more")
        .await
        .status()
        .as_u16()
}

/// A hash stored with other Argon2 parameters (an older release's, or Argon2i) is replaced at
/// the next successful login by one with the current parameters; the password keeps working.
async fn a_hash_of_other_parameters_is_upgraded_at_login(url: String, _db: TestDb) {
    use argon2::password_hash::{PasswordHasher, SaltString};
    use argon2::{Algorithm, Argon2, Params, Version};
    let (app, acme) = app(&url, GENEROUS).await;
    account(&app, &acme, "ada@example.com", Some(PASSWORD), true).await;
    let salt = SaltString::encode_b64(&[5; 16]).unwrap();
    let older = [
        (Algorithm::Argon2id, Params::new(8 * 1024, 1, 1, None)),
        (Algorithm::Argon2i, Params::new(19 * 1024, 2, 1, None)),
    ];
    for (algorithm, params) in older {
        let old = Argon2::new(algorithm, Version::V0x13, params.unwrap())
            .hash_password(PASSWORD.as_bytes(), &salt)
            .unwrap()
            .to_string();
        execute(
            &url,
            &format!(
                "UPDATE oncely_users SET password_hash = '{old}' WHERE email = 'ada@example.com'"
            ),
        )
        .await;
        let wrong = login(&app, &acme, None, "ada@example.com", "not it").await;
        assert_eq!(wrong.status(), 401);
        assert_eq!(stored_hash(&app).await, old, "a failure changes nothing");
        let first = login(&app, &acme, None, "ada@example.com", PASSWORD).await;
        assert_eq!(first.status(), 200, "{old}");
        let new = stored_hash(&app).await;
        assert!(new.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{new}");
        let next = login(&app, &acme, None, "ada@example.com", PASSWORD).await;
        assert_eq!(next.status(), 200, "the new hash is the same password");
        assert_eq!(stored_hash(&app).await, new, "a current hash is kept");
    }
}

async fn stored_hash(app: &TestApp) -> String {
    use sqlx::Connection;
    let sql = "SELECT password_hash FROM oncely_users WHERE email = 'ada@example.com'";
    if app.database_url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(&app.database_url)
            .await
            .unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    } else {
        let mut conn = sqlx::SqliteConnection::connect(&app.database_url)
            .await
            .unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    }
}
