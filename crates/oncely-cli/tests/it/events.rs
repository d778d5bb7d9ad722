//! Events of the account flows (issue 17, items 2 and 6): each state change writes exactly one
//! event id, as one outbox job per enabled endpoint of its tenant subscribed to its type —
//! under 20 retries with one Idempotency-Key and 20 concurrent requests — and none for another
//! tenant's endpoint, a disabled one or one subscribed to other types. The flows run as their
//! callers run them: link pages in a browser (GET the page, POST without an API key), the rest
//! from the backend with the tenant's key. Failed requests write none; the jobs never hold an
//! address in clear, a token, a code, a password or its hash.

use std::collections::{BTreeMap, BTreeSet};

use oncely_server::accounts::{Accounts, NewEndpoint};
use oncely_server::limits::login::LoginLimits;
use oncely_testdb::TestDb;
use serde_json::{Value, json};

use uuid::Uuid;

use crate::requests::{app_with_mail_caps, email, nth_link, problem_type};
use crate::support::{TestApp, both_databases, execute, on_backend};

/// The event types of the account flows.
const ACCOUNT_TYPES: [&str; 6] = [
    "user.created",
    "user.verified",
    "user.signed_in",
    "user.email_changed",
    "password.changed",
    "invite.accepted",
];
const PASSWORD: &str = "correct horse battery";
const CALLBACK: &str = "https://app.example.com/auth/callback";

/// An app, a tenant whose events are watched, and its endpoints: two subscribed to every
/// account event (one to all events, one listing them), one disabled, one subscribed to email
/// events only; and one of another tenant.
struct World {
    app: TestApp,
    /// The tenant's API key (`None`: the default tenant, used without a key).
    key: Option<String>,
    /// The endpoints that must receive each account event.
    subscribed: BTreeSet<String>,
}

/// One outbox job of kind `webhook`.
#[derive(Debug)]
struct Delivery {
    endpoint: String,
    event_id: String,
    kind: String,
    body: String,
    /// The whole payload as stored.
    raw: String,
}

impl Delivery {
    fn body(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

async fn add_endpoint(url: &str, tenant: &str, address: &str, events: &str) -> String {
    let id = Uuid::new_v4();
    let endpoint = NewEndpoint {
        id,
        tenant,
        url: address,
        events,
        secret_sealed: "sealed-dummy-secret",
    };
    on_backend!(url, insert(url, endpoint));
    id.to_string()
}

async fn insert<B: Accounts>(url: &str, endpoint: NewEndpoint<'_>) {
    let accounts = B::connect(&oncely_server::backend::Location::url(url), 1)
        .await
        .unwrap();
    accounts.insert_webhook_endpoint(endpoint).await.unwrap();
}

/// The app with generous email and login caps (the tests repeat requests on purpose).
async fn app(url: &str) -> TestApp {
    app_with_mail_caps(url, 1000, 10_000, |settings| {
        settings.login = LoginLimits {
            per_address: 1000,
            per_address_total: 1000,
            per_client: 1000,
            window: settings.login.window,
        };
    })
    .await
}

/// The world of `tenant` (`default`: anonymous requests); `return_url`: the tenant's.
async fn world(url: &str, tenant: &str, return_url: Option<&str>) -> World {
    let app = app(url).await;
    let key = match tenant {
        "default" => None,
        name => Some(app.create_tenant(name).await),
    };
    if let Some(return_url) = return_url {
        crate::support::set_return_url(url, tenant, return_url).await;
    }
    app.create_tenant("other").await;
    let every = add_endpoint(url, tenant, "https://every.example/hook", "[]").await;
    let listed = json!(ACCOUNT_TYPES).to_string();
    let listed = add_endpoint(url, tenant, "https://listed.example/hook", &listed).await;
    add_endpoint(url, "other", "https://other.example/hook", "[]").await;
    add_endpoint(url, tenant, "https://disabled.example/hook", "[]").await;
    execute(
        url,
        "UPDATE oncely_webhook_endpoints SET disabled_at = created_at, disabled_reason = 'test'
          WHERE url = 'https://disabled.example/hook'",
    )
    .await;
    let mail_only = r#"["email.sent","email.failed"]"#;
    add_endpoint(url, tenant, "https://mail.example/hook", mail_only).await;
    World {
        app,
        key,
        subscribed: [every, listed].into(),
    }
}

impl World {
    /// A POST from the tenant's backend (with its key; the default tenant: without one).
    async fn backend(&self, path: &str, idempotency_key: &str, body: &Value) -> reqwest::Response {
        match &self.key {
            Some(key) => self.app.post_as(key, path, idempotency_key, body).await,
            None => self.app.post(path, idempotency_key, body).await,
        }
    }

    /// A signup (with `password`) of `address`; 202.
    async fn signup(&self, address: &str, password: Option<&str>) {
        let mut body = email(address);
        if let Some(password) = password {
            body["password"] = json!(password);
        }
        let key = format!("signup-{address}-{}", Uuid::new_v4());
        let response = self.backend("/v1/signup", &key, &body).await;
        assert_eq!(response.status(), 202);
    }

    /// Asks for a link of `path` for `address` (202) and returns the `n`th email's link, once
    /// the earlier emails to the address have arrived first: two jobs due at once may be sent
    /// in either order.
    async fn link(&self, path: &str, body: &Value, to: &str, n: usize) -> String {
        if n > 1 {
            self.app.emails_to(to, n - 1).await;
        }
        let key = format!("link-{}", Uuid::new_v4());
        let response = self.backend(path, &key, body).await;
        assert_eq!(response.status(), 202, "{path}");
        nth_link(&self.app, to, n).await
    }

    /// A verified account of `address` with `password` (signup, then its link); the link's
    /// email is the `n`th to the address.
    async fn verified(&self, address: &str, n: usize) {
        self.signup(address, Some(PASSWORD)).await;
        let link = nth_link(&self.app, address, n).await;
        let (status, body) = press(&self.app, &link, Some(PASSWORD), "verify-first").await;
        assert_eq!(status, 200, "{body}");
    }

    /// Every webhook job, oldest first.
    async fn deliveries(&self) -> Vec<Delivery> {
        deliveries(&self.app.database_url).await
    }

    /// The webhook jobs of account events, oldest first: not those of the email events
    /// (`email.sent` of each email the flows send: tests/it/email_events.rs).
    async fn account_deliveries(&self) -> Vec<Delivery> {
        let mut deliveries = self.deliveries().await;
        deliveries.retain(|d| !d.kind.starts_with("email."));
        deliveries
    }

    /// The ids of the events of `kind`, each checked: one job per subscribed endpoint, the
    /// same body in each, `{type, timestamp, data}` and nothing else. By event id: its data.
    async fn events(&self, kind: &str) -> BTreeMap<String, Value> {
        events(&self.deliveries().await, &self.subscribed, kind)
    }

    /// The data of the one event of `kind` about `user` (one event id).
    async fn one_event(&self, kind: &str, user: &str) -> Value {
        let about: Vec<Value> = self
            .events(kind)
            .await
            .into_values()
            .filter(|data| data["user_id"] == user)
            .collect();
        assert_eq!(about.len(), 1, "one {kind} event about {user}: {about:?}");
        about.into_iter().next().unwrap()
    }
}

async fn deliveries(url: &str) -> Vec<Delivery> {
    let sql = if url.starts_with("postgres") {
        "SELECT payload::text FROM oncely_outbox WHERE kind = 'webhook' ORDER BY id"
    } else {
        "SELECT payload FROM oncely_outbox WHERE kind = 'webhook' ORDER BY id"
    };
    let payloads = crate::support::texts(url, sql).await;
    payloads
        .into_iter()
        .map(|raw| {
            let payload: Value = serde_json::from_str(&raw).unwrap();
            let text = |field: &str| payload[field].as_str().unwrap().to_owned();
            Delivery {
                endpoint: text("endpoint_id"),
                event_id: text("event_id"),
                kind: text("type"),
                body: text("body"),
                raw,
            }
        })
        .collect()
}

fn events(
    deliveries: &[Delivery],
    subscribed: &BTreeSet<String>,
    kind: &str,
) -> BTreeMap<String, Value> {
    let mut by_event: BTreeMap<String, Vec<&Delivery>> = BTreeMap::new();
    for delivery in deliveries.iter().filter(|d| d.kind == kind) {
        by_event
            .entry(delivery.event_id.clone())
            .or_default()
            .push(delivery);
    }
    by_event
        .into_iter()
        .map(|(id, jobs)| {
            let endpoints: Vec<&String> = jobs.iter().map(|d| &d.endpoint).collect();
            let expected: Vec<&String> = subscribed.iter().collect();
            let mut sorted = endpoints.clone();
            sorted.sort();
            assert_eq!(
                sorted, expected,
                "{kind} {id}: one job per subscribed endpoint"
            );
            assert!(id.starts_with("msg_"), "{id}");
            assert!(jobs.iter().all(|d| d.body == jobs[0].body), "one body");
            let body = jobs[0].body();
            let fields: BTreeSet<&str> = body.as_object().unwrap().keys().map(|k| &**k).collect();
            assert_eq!(fields, ["data", "timestamp", "type"].into(), "{body}");
            assert_eq!(body["type"], kind);
            let timestamp = body["timestamp"].as_str().unwrap();
            let format = &time::format_description::well_known::Rfc3339;
            time::OffsetDateTime::parse(timestamp, format).expect("an RFC 3339 timestamp");
            (id, body["data"].clone())
        })
        .collect()
}

/// What the browser does with a link: opens its page, then POSTs the token (and a password) to
/// where the page was opened, with `key` as the Idempotency-Key and no API key.
async fn press(app: &TestApp, link: &str, password: Option<&str>, key: &str) -> (u16, Value) {
    let page = app.client.get(link).send().await.unwrap();
    assert_eq!(page.status(), 200, "the page opens");
    let mut action = reqwest::Url::parse(link).unwrap();
    let token = token_of(link);
    action.set_query(None);
    let mut body = json!({ "token": token });
    if let Some(password) = password {
        body["password"] = json!(password);
    }
    // A `503 busy` (every password hasher taken by the tests running at once; nothing ran) is
    // retried with the same key, as a person does when the link page says to try again.
    for _ in 0..100 {
        let answer = app
            .client
            .post(action.clone())
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let body: Value = answer.json().await.unwrap_or(Value::Null);
        if status != 503 || !body["type"].as_str().is_some_and(|t| t.ends_with("/busy")) {
            return (status, body);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the password hashers stayed busy");
}

fn token_of(link: &str) -> String {
    let url = reqwest::Url::parse(link).unwrap();
    let (_, token) = url.query_pairs().find(|(k, _)| k == "token").unwrap();
    token.into_owned()
}

/// 20 POSTs of the link with one key, in a row: each answers 200 (from the second on, a
/// replay).
async fn pressed_twenty_times(app: &TestApp, link: &str, password: Option<&str>) -> Value {
    let mut first = Value::Null;
    for i in 0..20 {
        let (status, body) = press(app, link, password, "one-key").await;
        assert_eq!(status, 200, "attempt {i}: {body}");
        if i == 0 {
            first = body;
        }
    }
    first
}

/// 20 concurrent POSTs of the link with distinct keys: exactly one uses it.
async fn pressed_at_once(app: &TestApp, link: &str, password: Option<&str>) {
    let keys: Vec<String> = (0..20).map(|i| format!("at-once-{i}")).collect();
    let answers =
        futures::future::join_all(keys.iter().map(|key| press(app, link, password, key))).await;
    let used = answers.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!(used, 1, "{answers:?}");
    for (status, body) in &answers {
        assert!(*status != 200 || body["status"].is_string(), "{body}");
    }
}

/// The link is used already: a new key gets 400 `token-invalid`.
async fn used(app: &TestApp, link: &str, password: Option<&str>) {
    let (status, body) = press(app, link, password, &Uuid::new_v4().to_string()).await;
    assert_eq!((status, problem_type(&body)), (400, "token-invalid"));
}

/// No job holds any of `secrets` (addresses, tokens, codes, passwords), nor a password hash.
async fn assert_clean(world: &World, secrets: &[&str]) {
    let deliveries = world.deliveries().await;
    assert!(!deliveries.is_empty());
    for delivery in &deliveries {
        for secret in secrets.iter().chain(&["$argon2", PASSWORD]) {
            assert!(
                !delivery.raw.contains(secret),
                "{secret} in a webhook job: {}",
                delivery.raw
            );
        }
    }
}

/// Hyphenated id of the account of `address` in `tenant`, from the database.
async fn user_id(world: &World, tenant: &str, address: &str) -> String {
    crate::support::user_id(&world.app.database_url, tenant, address).await
}

both_databases!(
    a_signup_that_creates_an_account_writes_one_user_created,
    a_verification_link_writes_one_user_verified,
    a_magic_link_writes_one_user_signed_in_and_verifies_a_pending_account_once,
    a_login_writes_one_user_signed_in_per_sign_in_and_none_for_a_replay_or_a_failure,
    a_confirmed_email_change_writes_one_user_email_changed,
    a_password_reset_writes_one_password_changed,
    an_accepted_invitation_writes_one_invite_accepted_and_user_created_for_a_new_account,
    the_default_tenants_anonymous_flows_write_its_events,
    a_tenant_without_endpoints_writes_no_webhook_jobs,
);

async fn a_signup_that_creates_an_account_writes_one_user_created(url: String, _db: TestDb) {
    let world = world(&url, "acme", None).await;
    let ada = "ada@example.com";
    // Invalid bodies write nothing.
    for body in [email("not an address"), json!({ "email": ada, "extra": 1 })] {
        let response = world.backend("/v1/signup", "bad", &body).await;
        assert_eq!(response.status(), 400);
    }
    assert!(world.deliveries().await.is_empty());
    // Twenty retries with one key, then twenty at once with distinct keys: one account.
    for _ in 0..20 {
        let response = world.backend("/v1/signup", "signup-ada", &email(ada)).await;
        assert_eq!(response.status(), 202);
    }
    let (body, keys) = (email(ada), (0..20).map(|i| format!("again-{i}")));
    let keys: Vec<String> = keys.collect();
    let at_once =
        futures::future::join_all(keys.iter().map(|k| world.backend("/v1/signup", k, &body))).await;
    assert!(at_once.iter().all(|r| r.status() == 202));
    // A second address, only at once.
    let bob = "bob@example.com";
    let body = email(bob);
    let keys: Vec<String> = (0..20).map(|i| format!("bob-{i}")).collect();
    let at_once =
        futures::future::join_all(keys.iter().map(|k| world.backend("/v1/signup", k, &body))).await;
    assert!(at_once.iter().all(|r| r.status() == 202));

    let created = world.events("user.created").await;
    assert_eq!(created.len(), 2, "one event per account: {created:?}");
    let ada_id = user_id(&world, "acme", ada).await;
    let data = world.one_event("user.created", &ada_id).await;
    assert_eq!(
        data,
        json!({ "user_id": ada_id, "email": "a***@example.com", "email_verified": false })
    );
    let bob_id = user_id(&world, "acme", bob).await;
    world.one_event("user.created", &bob_id).await;
    // Nothing else happened.
    let deliveries = world.account_deliveries().await;
    assert!(deliveries.iter().all(|d| d.kind == "user.created"));
    assert_clean(&world, &[ada, bob]).await;
}

async fn a_verification_link_writes_one_user_verified(url: String, _db: TestDb) {
    let world = world(&url, "acme", None).await;
    let (ada, bob) = ("ada@example.com", "bob@example.com");
    world.signup(ada, Some(PASSWORD)).await;
    let link = nth_link(&world.app, ada, 1).await;
    // Failures write nothing: a wrong re-entered password, a token that is no link's.
    let (status, _) = press(&world.app, &link, Some("not the password"), "wrong").await;
    assert_eq!(status, 400);
    let (status, _) = press(&world.app, &format!("{link}x"), None, "forged").await;
    assert_eq!(status, 400);
    assert!(world.events("user.verified").await.is_empty());

    let first = pressed_twenty_times(&world.app, &link, Some(PASSWORD)).await;
    assert_eq!(first["status"], "verified");
    used(&world.app, &link, Some(PASSWORD)).await;
    let ada_id = user_id(&world, "acme", ada).await;
    let data = world.one_event("user.verified", &ada_id).await;
    assert_eq!(
        data,
        json!({ "user_id": ada_id, "email": "a***@example.com" })
    );

    world.signup(bob, None).await;
    let bob_link = nth_link(&world.app, bob, 1).await;
    pressed_at_once(&world.app, &bob_link, None).await;
    used(&world.app, &bob_link, None).await;
    let bob_id = user_id(&world, "acme", bob).await;
    world.one_event("user.verified", &bob_id).await;
    assert_eq!(world.events("user.verified").await.len(), 2);
    assert_clean(&world, &[ada, bob, &token_of(&link), &token_of(&bob_link)]).await;
}

async fn a_magic_link_writes_one_user_signed_in_and_verifies_a_pending_account_once(
    url: String,
    _db: TestDb,
) {
    let world = world(&url, "acme", Some(CALLBACK)).await;
    let (ada, pat) = ("ada@example.com", "pat@example.com");
    world.verified(ada, 1).await;
    let ada_id = user_id(&world, "acme", ada).await;
    let link = world.link("/v1/magic-link", &email(ada), ada, 2).await;
    // A password is not what this link takes: nothing written.
    let (status, _) = press(&world.app, &link, Some(PASSWORD), "with-password").await;
    assert_eq!(status, 400);
    assert!(world.events("user.signed_in").await.is_empty());

    let first = pressed_twenty_times(&world.app, &link, None).await;
    let redirect = first["redirect"].as_str().expect("a redirect with a code");
    let code = redirect.split("code=").nth(1).unwrap().to_owned();
    used(&world.app, &link, None).await;
    let data = world.one_event("user.signed_in", &ada_id).await;
    assert_eq!(
        data,
        json!({ "user_id": ada_id, "email": "a***@example.com", "method": "magic_link" })
    );

    let again = world.link("/v1/magic-link", &email(ada), ada, 3).await;
    pressed_at_once(&world.app, &again, None).await;
    let signed_in = world.events("user.signed_in").await;
    assert_eq!(signed_in.len(), 2, "one per link used: {signed_in:?}");
    // Ada was verified before: no user.verified from her magic links.
    assert_eq!(world.events("user.verified").await.len(), 1);

    // A pending account's magic link verifies it: user.verified once, then user.signed_in.
    world.signup(pat, None).await;
    let pat_id = user_id(&world, "acme", pat).await;
    let pat_link = world.link("/v1/magic-link", &email(pat), pat, 2).await;
    pressed_at_once(&world.app, &pat_link, None).await;
    world.one_event("user.verified", &pat_id).await;
    let data = world.one_event("user.signed_in", &pat_id).await;
    assert_eq!(data["method"], "magic_link");
    let tokens = [token_of(&link), token_of(&again), token_of(&pat_link)];
    let mut secrets: Vec<&str> = tokens.iter().map(String::as_str).collect();
    secrets.extend([ada, pat, &code]);
    assert_clean(&world, &secrets).await;
}

async fn a_login_writes_one_user_signed_in_per_sign_in_and_none_for_a_replay_or_a_failure(
    url: String,
    _db: TestDb,
) {
    let world = world(&url, "acme", None).await;
    let ada = "ada@example.com";
    world.verified(ada, 1).await;
    let ada_id = user_id(&world, "acme", ada).await;
    let api_key = world.key.clone().unwrap();
    let login = |password: &str, key: Option<&str>| {
        let mut request = world
            .app
            .client
            .post(format!("{}/v1/login", world.app.base))
            .bearer_auth(&api_key)
            .json(&json!({ "email": ada, "password": password }));
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send()
    };
    // One login as a client sends it: a 503 (every password hasher busy — the pool is shared
    // by the tests running at once —, or a loaded SQLite's write lock not free in time: nothing
    // ran) is retried, a bounded number of times.
    let login_retried = async |password: &str, key: Option<&str>| {
        for _ in 0..100 {
            let response = login(password, key).await.unwrap();
            if response.status() != 503 {
                return response;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("503 a hundred times");
    };
    // Failures write nothing: a wrong password (with and without a key), an invalid body.
    assert_eq!(
        login_retried("wrong password", Some("k0")).await.status(),
        401
    );
    assert_eq!(login_retried("wrong password", None).await.status(), 401);
    let invalid = world.backend("/v1/login", "k1", &email(ada)).await;
    assert_eq!(invalid.status(), 400);
    assert!(world.events("user.signed_in").await.is_empty());

    // Twenty retries with one key: one sign-in.
    for i in 0..20 {
        let response = login_retried(PASSWORD, Some("login-1")).await;
        assert_eq!(response.status(), 200, "attempt {i}");
        assert_eq!(
            response.headers().contains_key("idempotent-replayed"),
            i > 0
        );
    }
    let data = world.one_event("user.signed_in", &ada_id).await;
    assert_eq!(
        data,
        json!({ "user_id": ada_id, "email": "a***@example.com", "method": "password" })
    );
    // Twenty at once with one key: one more sign-in, whichever claimed the key.
    let at_once =
        futures::future::join_all((0..20).map(|_| login(PASSWORD, Some("login-2")))).await;
    let mut answers = Vec::new();
    for response in at_once {
        let response = response.unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        answers.push((status, problem_type(&body).to_owned()));
    }
    assert!(answers.iter().any(|(s, _)| *s == 200), "{answers:?}");
    // The rest: replays, a key in use, every password hasher busy or the database (a loaded
    // SQLite's write lock) not free in time — nothing ran, retry later.
    assert!(
        answers.iter().all(|(s, t)| *s == 200
            || (*s, &**t) == (409, "idempotency-key-in-use")
            || (*s, &**t) == (503, "busy")
            || (*s, &**t) == (503, "storage-unavailable")),
        "{answers:?}"
    );
    assert_eq!(world.events("user.signed_in").await.len(), 2);
    // Without a key each login is a sign-in of its own.
    for _ in 0..3 {
        assert_eq!(login_retried(PASSWORD, None).await.status(), 200);
    }
    let signed_in = world.events("user.signed_in").await;
    assert_eq!(signed_in.len(), 5, "{signed_in:?}");
    assert!(signed_in.values().all(|data| data
        == &json!({
            "user_id": ada_id, "email": "a***@example.com", "method": "password"
        })));
    assert_clean(&world, &[ada]).await;
}

async fn a_confirmed_email_change_writes_one_user_email_changed(url: String, _db: TestDb) {
    let world = world(&url, "acme", None).await;
    let (old, new) = ("old@example.com", "new@example.com");
    world.verified(old, 1).await;
    let id = user_id(&world, "acme", old).await;
    let path = format!("/v1/users/{id}/email-change");
    // Invalid requests write nothing (nor does asking).
    let invalid = world
        .backend(&path, "bad", &json!({ "new_email": "x" }))
        .await;
    assert_eq!(invalid.status(), 400);
    let link = world
        .link(&path, &json!({ "new_email": new }), new, 1)
        .await;
    assert!(world.events("user.email_changed").await.is_empty());

    let first = pressed_twenty_times(&world.app, &link, None).await;
    assert_eq!(first["status"], "email_changed");
    used(&world.app, &link, None).await;
    let data = world.one_event("user.email_changed", &id).await;
    assert_eq!(
        data,
        json!({ "user_id": id, "email": "n***@example.com", "previous_email": "o***@example.com" })
    );
    // Verified before: no user.verified from the change.
    assert_eq!(world.events("user.verified").await.len(), 1);

    // At once, for another account — a pending one, which the change verifies.
    let (pending, moved) = ("pending@example.com", "moved@example.com");
    world.signup(pending, None).await;
    let pending_id = user_id(&world, "acme", pending).await;
    let path = format!("/v1/users/{pending_id}/email-change");
    let link2 = world
        .link(&path, &json!({ "new_email": moved }), moved, 1)
        .await;
    pressed_at_once(&world.app, &link2, None).await;
    let data = world.one_event("user.email_changed", &pending_id).await;
    assert_eq!(data["email"], "m***@example.com");
    assert_eq!(data["previous_email"], "p***@example.com");
    let data = world.one_event("user.verified", &pending_id).await;
    assert_eq!(data["email"], "m***@example.com");
    assert_eq!(world.events("user.email_changed").await.len(), 2);
    let tokens = [token_of(&link), token_of(&link2)];
    let secrets = [old, new, pending, moved, &tokens[0], &tokens[1]];
    assert_clean(&world, &secrets).await;
}

async fn a_password_reset_writes_one_password_changed(url: String, _db: TestDb) {
    let world = world(&url, "acme", None).await;
    let ada = "ada@example.com";
    let new_password = "a brand new password";
    world.verified(ada, 1).await;
    let id = user_id(&world, "acme", ada).await;
    let link = world.link("/v1/password-reset", &email(ada), ada, 2).await;
    // Failures write nothing: no password, one too short.
    let (status, _) = press(&world.app, &link, None, "none").await;
    assert_eq!(status, 400);
    let (status, _) = press(&world.app, &link, Some("short"), "short").await;
    assert_eq!(status, 400);
    assert!(world.events("password.changed").await.is_empty());

    let first = pressed_twenty_times(&world.app, &link, Some(new_password)).await;
    assert_eq!(first["status"], "password_changed");
    used(&world.app, &link, Some(new_password)).await;
    let data = world.one_event("password.changed", &id).await;
    assert_eq!(data, json!({ "user_id": id, "email": "a***@example.com" }));

    let again = world.link("/v1/password-reset", &email(ada), ada, 3).await;
    pressed_at_once(&world.app, &again, Some(new_password)).await;
    assert_eq!(world.events("password.changed").await.len(), 2);
    // Verified before: the reset writes no user.verified.
    assert_eq!(world.events("user.verified").await.len(), 1);

    // A pending account's reset verifies it, once.
    let pat = "pat@example.com";
    world.signup(pat, None).await;
    let pat_id = user_id(&world, "acme", pat).await;
    let pat_link = world.link("/v1/password-reset", &email(pat), pat, 2).await;
    pressed_at_once(&world.app, &pat_link, Some(new_password)).await;
    world.one_event("user.verified", &pat_id).await;
    world.one_event("password.changed", &pat_id).await;
    let tokens = [token_of(&link), token_of(&again), token_of(&pat_link)];
    let secrets = [ada, pat, new_password, &tokens[0], &tokens[1], &tokens[2]];
    assert_clean(&world, &secrets).await;
}

async fn an_accepted_invitation_writes_one_invite_accepted_and_user_created_for_a_new_account(
    url: String,
    _db: TestDb,
) {
    let world = world(&url, "acme", None).await;
    let (dan, ada, pat) = ("dan@example.com", "ada@example.com", "pat@example.com");
    // Inviting a new address: twenty acceptances with one key create one account.
    let link = world.link("/v1/invites", &email(dan), dan, 1).await;
    let (status, _) = press(&world.app, &link, Some("short"), "short").await;
    assert_eq!(status, 400, "an invalid password writes nothing");
    assert!(world.account_deliveries().await.is_empty());
    let first = pressed_twenty_times(&world.app, &link, Some(PASSWORD)).await;
    assert_eq!(first["status"], "joined");
    used(&world.app, &link, Some(PASSWORD)).await;
    let dan_id = user_id(&world, "acme", dan).await;
    let data = world.one_event("user.created", &dan_id).await;
    assert_eq!(
        data,
        json!({ "user_id": dan_id, "email": "d***@example.com", "email_verified": true })
    );
    let data = world.one_event("invite.accepted", &dan_id).await;
    assert_eq!(
        data,
        json!({ "user_id": dan_id, "email": "d***@example.com", "created": true })
    );
    assert!(world.events("user.verified").await.is_empty());

    // A verified account accepts at once: invite.accepted only.
    world.verified(ada, 1).await;
    let ada_id = user_id(&world, "acme", ada).await;
    let ada_link = world.link("/v1/invites", &email(ada), ada, 2).await;
    pressed_at_once(&world.app, &ada_link, None).await;
    let data = world.one_event("invite.accepted", &ada_id).await;
    assert_eq!(data["created"], false);
    world.one_event("user.verified", &ada_id).await; // from her verification link
    world.one_event("user.created", &ada_id).await; // from her signup

    // A pending account accepts at once: user.verified once, and invite.accepted.
    world.signup(pat, None).await;
    let pat_id = user_id(&world, "acme", pat).await;
    let pat_link = world.link("/v1/invites", &email(pat), pat, 2).await;
    pressed_at_once(&world.app, &pat_link, None).await;
    world.one_event("user.verified", &pat_id).await;
    let data = world.one_event("invite.accepted", &pat_id).await;
    assert_eq!(data["created"], false);
    assert_eq!(world.events("user.created").await.len(), 3);
    assert_eq!(world.events("invite.accepted").await.len(), 3);
    let tokens = [token_of(&link), token_of(&ada_link), token_of(&pat_link)];
    let secrets = [dan, ada, pat, &tokens[0], &tokens[1], &tokens[2]];
    assert_clean(&world, &secrets).await;
}

async fn the_default_tenants_anonymous_flows_write_its_events(url: String, _db: TestDb) {
    let world = world(&url, "default", None).await;
    let ada = "ada@example.com";
    // Anonymous: a signup and its link, as the README's first example.
    for _ in 0..20 {
        let response = world.app.post("/v1/signup", "s1", &email(ada)).await;
        assert_eq!(response.status(), 202);
    }
    let link = nth_link(&world.app, ada, 1).await;
    pressed_at_once(&world.app, &link, None).await;
    let id = user_id(&world, "default", ada).await;
    world.one_event("user.created", &id).await;
    world.one_event("user.verified", &id).await;
    // The magic link, anonymous as well.
    let magic = world.link("/v1/magic-link", &email(ada), ada, 2).await;
    pressed_twenty_times(&world.app, &magic, None).await;
    world.one_event("user.signed_in", &id).await;
    assert_eq!(
        world.account_deliveries().await.len(),
        6,
        "three events, two endpoints"
    );
    assert_clean(&world, &[ada, &token_of(&link), &token_of(&magic)]).await;
}

async fn a_tenant_without_endpoints_writes_no_webhook_jobs(url: String, _db: TestDb) {
    // `watched` and `other` have endpoints; `acme` none.
    let world = world(&url, "watched", None).await;
    let app = &world.app;
    let key = app.create_tenant("acme").await;
    let ada = "ada@example.com";
    let body = json!({ "email": ada, "password": PASSWORD });
    assert_eq!(
        app.post_as(&key, "/v1/signup", "s", &body).await.status(),
        202
    );
    let link = nth_link(app, ada, 1).await;
    let (status, body) = press(app, &link, Some(PASSWORD), "v").await;
    assert_eq!((status, &body["status"]), (200, &json!("verified")));
    let id = user_id(&world, "acme", ada).await;
    let magic = {
        let response = app.post_as(&key, "/v1/magic-link", "m", &email(ada)).await;
        assert_eq!(response.status(), 202);
        nth_link(app, ada, 2).await
    };
    let (status, _) = press(app, &magic, None, "m").await;
    assert_eq!(status, 200);
    let login = json!({ "email": ada, "password": PASSWORD });
    let response = app.post_as(&key, "/v1/login", "l", &login).await;
    assert_eq!(response.status(), 200);
    let reset = {
        let response = app
            .post_as(&key, "/v1/password-reset", "r", &email(ada))
            .await;
        assert_eq!(response.status(), 202);
        nth_link(app, ada, 3).await
    };
    let (status, _) = press(app, &reset, Some("another password"), "r").await;
    assert_eq!(status, 200);
    let path = format!("/v1/users/{id}/email-change");
    let change = app
        .post_as(
            &key,
            &path,
            "c",
            &json!({ "new_email": "ada2@example.com" }),
        )
        .await;
    assert_eq!(change.status(), 202);
    let change = nth_link(app, "ada2@example.com", 1).await;
    let (status, _) = press(app, &change, None, "c").await;
    assert_eq!(status, 200);
    let invite = {
        let response = app
            .post_as(&key, "/v1/invites", "i", &email("dan@example.com"))
            .await;
        assert_eq!(response.status(), 202);
        nth_link(app, "dan@example.com", 1).await
    };
    let (status, _) = press(app, &invite, None, "i").await;
    assert_eq!(status, 200);
    assert!(
        world.deliveries().await.is_empty(),
        "acme has no endpoint; the others' hear nothing of acme"
    );
}
