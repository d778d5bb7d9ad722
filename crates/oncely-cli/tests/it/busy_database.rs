//! Every route that sends an email, while the database cannot serve it now — a table or row it
//! must write held by another transaction past the request's `lock_timeout`, or its connection
//! ended by the server: 503 `storage-unavailable` with `Retry-After`, nothing stored, and the
//! same request retried later gives its one email. Review of issue 20 (F2): the lock waits in
//! the email caps, the link's token and the outbox answered 500, as did an ended connection.
//! Walked as an application's backend does, with its tenant's API key on a tenant of its own.

use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use crate::requests::{app_with_mail_caps, email, nth_token, problem_type, token};
use crate::support::{TestApp, open_backend};

/// The accounts the sending routes need on tenant `acme`: a verified one (`v@`), a pending one
/// (`p@`); returns the tenant's API key and the verified account's id.
async fn accounts(app: &TestApp) -> (String, String) {
    let key = app.create_tenant("acme").await;
    for address in ["v@example.com", "p@example.com"] {
        let signup = app
            .post_as(&key, "/v1/signup", &format!("s-{address}"), &email(address))
            .await;
        assert_eq!(signup.status(), 202);
    }
    let presented = token(&nth_token(app, "v@example.com", 1).await);
    let verify = app.post_as(&key, "/v1/verify", "v", &presented).await;
    assert_eq!(verify.status(), 200);
    let mut conn = PgConnection::connect(&app.database_url).await.unwrap();
    let id: String = sqlx::query_scalar(
        "SELECT id::text FROM oncely_users WHERE tenant = 'acme' AND email = 'v@example.com'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    (key, id)
}

/// Each sending route: its path, body, and the address whose email it sends.
fn sending_routes(user: &str) -> Vec<(String, Value, &'static str)> {
    vec![
        (
            "/v1/signup".into(),
            email("new@example.com"),
            "new@example.com",
        ),
        (
            "/v1/verification/resend".into(),
            email("p@example.com"),
            "p@example.com",
        ),
        (
            "/v1/password-reset".into(),
            email("v@example.com"),
            "v@example.com",
        ),
        (
            "/v1/magic-link".into(),
            email("v@example.com"),
            "v@example.com",
        ),
        (
            "/v1/invites".into(),
            email("guest@example.com"),
            "guest@example.com",
        ),
        (
            format!("/v1/users/{user}/email-change"),
            json!({ "new_email": "moved@example.com" }),
            "moved@example.com",
        ),
    ]
}

async fn assert_storage_unavailable(response: reqwest::Response, route: &str) {
    assert_eq!(response.status(), 503, "{route}");
    let retry_after = response.headers().get("retry-after").cloned();
    let problem: Value = response.json().await.unwrap();
    assert_eq!(
        problem_type(&problem),
        "storage-unavailable",
        "{route}: {problem}"
    );
    assert_eq!(retry_after.unwrap(), "1", "{route}");
}

/// Another session's transaction, which ran `statements` and holds their locks until
/// [`Held::release`] (a rollback).
struct Held(PgConnection);

impl Held {
    async fn open(url: &str, statements: &[&str]) -> Self {
        let mut held = Self(PgConnection::connect(url).await.unwrap());
        held.run("BEGIN").await;
        for statement in statements {
            held.run(statement).await;
        }
        held
    }

    async fn run(&mut self, statement: &str) {
        sqlx::raw_sql(AssertSqlSafe(statement.to_owned()))
            .execute(&mut self.0)
            .await
            .unwrap();
    }

    async fn release(mut self) {
        self.run("ROLLBACK").await;
    }
}

/// The backends of this database that wait on a lock, once there is one (a request that
/// [`Held`] holds up).
async fn lock_waiters(url: &str) -> Vec<i32> {
    let mut admin = PgConnection::connect(url).await.unwrap();
    let waiting = "SELECT pid FROM pg_stat_activity
                    WHERE datname = current_database() AND wait_event_type = 'Lock'";
    loop {
        let pids: Vec<i32> = sqlx::query_scalar(waiting)
            .fetch_all(&mut admin)
            .await
            .unwrap();
        if !pids.is_empty() {
            return pids;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// While `lock` (statements run in a transaction of another session) holds what the routes
/// must write, each sending route answers 503 and sends nothing; once it is released, the same
/// keys send one email each.
async fn each_sending_route_is_a_503_while(lock: &[&str]) {
    let (url, _db) = crate::support::postgres_db().await;
    let app = app_with_mail_caps(&url, 100, 1000, |_| {}).await;
    let (key, user) = accounts(&app).await;
    let routes = sending_routes(&user);
    let before: Vec<usize> = routes
        .iter()
        .map(|(_, _, to)| app.inbox.messages(Some(to)).len())
        .collect();
    let held = Held::open(&url, lock).await;
    for (i, (path, body, _)) in routes.iter().enumerate() {
        let answer = app.post_as(&key, path, &format!("busy-{i}"), body).await;
        assert_storage_unavailable(answer, path).await;
    }
    held.release().await;
    for (i, (path, body, _)) in routes.iter().enumerate() {
        let answer = app.post_as(&key, path, &format!("busy-{i}"), body).await;
        assert!(answer.status().is_success(), "{path}: {}", answer.status());
    }
    // One email per request (v@ gets two: the reset and the magic link; the change also
    // notifies v@, which is not counted here).
    for ((path, _, to), before) in routes.iter().zip(before) {
        let expected = before + routes.iter().filter(|(_, _, t)| t == to).count();
        let got = app.emails_to(to, expected).await.len();
        assert!(
            got >= expected,
            "{path}: {got} emails to {to}, {expected} expected"
        );
    }
    let sent = |to: &str| app.inbox.messages(Some(to)).len();
    assert_eq!(sent("new@example.com"), 1);
    assert_eq!(
        sent("p@example.com"),
        2,
        "the signup's email and the resend"
    );
    assert_eq!(sent("guest@example.com"), 1);
    assert_eq!(sent("moved@example.com"), 1);
    // The verification, the reset, the magic link and the change's notice.
    assert_eq!(sent("v@example.com"), 4);
}

#[tokio::test]
async fn every_sending_route_is_a_503_while_the_outbox_is_locked() {
    each_sending_route_is_a_503_while(&["LOCK TABLE oncely_outbox IN EXCLUSIVE MODE"]).await;
}

#[tokio::test]
async fn every_sending_route_is_a_503_while_the_email_counters_are_locked() {
    each_sending_route_is_a_503_while(&["LOCK TABLE oncely_rate_limits IN EXCLUSIVE MODE"]).await;
}

#[tokio::test]
async fn every_sending_route_is_a_503_while_the_links_table_is_locked() {
    each_sending_route_is_a_503_while(&["LOCK TABLE oncely_tokens IN EXCLUSIVE MODE"]).await;
}

/// The server ends the request's connection while the request waits (a restart, an operator's
/// `pg_terminate_backend`, a failover): 503, and the retry sends the one email.
#[tokio::test]
async fn a_sending_route_whose_connection_the_server_ends_is_a_503_then_retries() {
    let (url, _db) = crate::support::postgres_db().await;
    let app = app_with_mail_caps(&url, 100, 1000, |_| {}).await;
    let (key, _) = accounts(&app).await;
    let held = Held::open(&url, &["LOCK TABLE oncely_outbox IN EXCLUSIVE MODE"]).await;
    let body = email("ended@example.com");
    let waiting = app.post_as(&key, "/v1/signup", "ended", &body);
    let terminate = async {
        let mut admin = PgConnection::connect(&url).await.unwrap();
        for pid in lock_waiters(&url).await {
            let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(&mut admin)
                .await
                .unwrap();
            assert!(ended);
        }
    };
    let (answer, ()) = tokio::join!(waiting, terminate);
    assert_storage_unavailable(answer, "/v1/signup").await;
    held.release().await;
    let retried = app.post_as(&key, "/v1/signup", "ended", &body).await;
    assert_eq!(retried.status(), 202);
    assert_eq!(app.emails_to("ended@example.com", 1).await.len(), 1);
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_users WHERE email = 'ended@example.com'")
            .await,
        1
    );
}

/// Review of issue 20 (F2's follow-up): each 503 "nothing was changed; retry with the same key"
/// used one of the client's emails (the per-client cap, counted in the process before the
/// transaction failed), so a client that retried as told through a few busy seconds found its
/// email suppressed — under a 202 that said it was on its way. A failed request gives the email
/// back.
#[tokio::test]
async fn retries_through_503s_do_not_use_up_the_clients_emails() {
    let (url, _db) = crate::support::postgres_db().await;
    let app = app_with_mail_caps(&url, 100, 3, |_| {}).await;
    let held = Held::open(&url, &["LOCK TABLE oncely_outbox IN EXCLUSIVE MODE"]).await;
    let body = email("carol@example.com");
    for _ in 0..4 {
        let answer = app.post("/v1/signup", "capped", &body).await;
        assert_storage_unavailable(answer, "/v1/signup").await;
    }
    held.release().await;
    let retried = app.post("/v1/signup", "capped", &body).await;
    assert_eq!(retried.status(), 202);
    assert_eq!(app.emails_to("carol@example.com", 1).await.len(), 1);
    let suppressed = "SELECT count(*) FROM oncely_outbox WHERE last_error LIKE 'suppressed%'";
    assert_eq!(app.count(suppressed).await, 0);
}

/// Review of issue 20 (F2's follow-up): a verification and a resend of one account take their
/// rows in opposite orders, and PostgreSQL broke the occasional deadlock by ending one of them
/// (40P01), answered 500. It is a 503 like any "cannot serve now": nothing was kept, and the
/// same request retried succeeds. Made certain here: another session holds the account's links
/// (as a verification does), the resend waits on them, and that session then waits on the
/// resend's idempotency key; the resend's deadlock check (after 1 s) ends the resend.
#[tokio::test]
async fn a_resend_that_postgres_ends_to_break_a_deadlock_is_a_503_then_retries() {
    let (url, _db) = crate::support::postgres_db().await;
    let app = app_with_mail_caps(&url, 100, 1000, |_| {}).await;
    let owner = "locked@example.com";
    assert_eq!(
        app.post("/v1/signup", "s", &email(owner)).await.status(),
        202
    );
    assert_eq!(app.emails_to(owner, 1).await.len(), 1);
    let hold_links = format!(
        "SELECT 1 FROM oncely_tokens t JOIN oncely_users u ON u.id = t.user_id
          WHERE u.email = '{owner}' FOR UPDATE OF t"
    );
    // This session never runs the check itself: the resend does, and is the one ended.
    let mut held = Held::open(&url, &["SET LOCAL deadlock_timeout = '20s'", &hold_links]).await;
    let body = email(owner);
    let resend = app.post("/v1/verification/resend", "dead", &body);
    let close_the_cycle = async {
        lock_waiters(&url).await;
        // Waits on the resend's uncommitted claim of its key: the cycle.
        held.run(
            "INSERT INTO oncely_idempotency_keys
                    (tenant, method, route, idem_key, fingerprint, state, fence, lease_until,
                     expires_at, created_at)
             VALUES ('default', 'POST', '/v1/verification/resend', 'dead', '\\x00'::bytea,
                     'in_progress', gen_random_uuid(), now(), now(), now())
             ON CONFLICT DO NOTHING",
        )
        .await;
    };
    let (answer, ()) = tokio::join!(resend, close_the_cycle);
    assert_storage_unavailable(answer, "/v1/verification/resend").await;
    held.release().await;
    let retried = app
        .post("/v1/verification/resend", "dead", &email(owner))
        .await;
    assert_eq!(retried.status(), 202);
    assert_eq!(app.emails_to(owner, 2).await.len(), 2);
}

/// Review of issue 20 (F2's follow-up): statements outside the idempotency layer's transaction
/// had no lock timeout — a verify's password attempt, counted on the pool, waited as long as
/// another session held the links table (the review saw 62 s for a login), holding a pool
/// connection all along. Every statement of the pool now gives up after 1.5 s: 503.
#[tokio::test]
async fn a_password_attempt_waiting_on_a_held_lock_is_a_503_in_seconds() {
    let (url, _db) = crate::support::postgres_db().await;
    let app = app_with_mail_caps(&url, 100, 1000, |_| {}).await;
    let owner = "waits@example.com";
    let signup = json!({ "email": owner, "password": "owner password" });
    assert_eq!(app.post("/v1/signup", "s", &signup).await.status(), 202);
    let link = crate::requests::nth_link(&app, owner, 1).await;
    let held = Held::open(&url, &["LOCK TABLE oncely_tokens IN EXCLUSIVE MODE"]).await;
    let click = crate::requests::click(&app, &link, Some("owner password"));
    let (status, body) = tokio::time::timeout(std::time::Duration::from_secs(10), click)
        .await
        .expect("the attempt gave up on the lock");
    assert_eq!(
        (status, problem_type(&body)),
        (503, "storage-unavailable"),
        "{body}"
    );
    held.release().await;
    let (status, body) = crate::requests::click(&app, &link, Some("owner password")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["password_set"], true);
}

/// The pool's sessions give up on a lock after 1.5 s; the migrations' and the worker's wait as
/// long as it takes (for another process's migration, or a table's lock, rather than fail a
/// deploy; a sent email's record rather than send it again).
#[tokio::test]
async fn the_pool_gives_up_on_locks_and_the_migrations_wait() {
    use oncely_server::backend::{Backend, Postgres};

    let (url, _db) = crate::support::postgres_db().await;
    let backend = open_backend::<Postgres>(url.as_str()).await;
    let show = "SHOW lock_timeout";
    let pooled: String = sqlx::query_scalar(show)
        .fetch_one(backend.pool())
        .await
        .unwrap();
    assert_eq!(pooled, "1500ms");
    let migrations = <sqlx::Postgres as oncely_sql::open::Open>::migration_pool(backend.opened())
        .await
        .unwrap();
    let migrating: String = sqlx::query_scalar(show)
        .fetch_one(&migrations)
        .await
        .unwrap();
    assert_eq!(migrating, "0");
    <sqlx::Postgres as oncely_sql::open::Open>::done_migrating(migrations).await;
    // Second review: the worker's record of a sent email gave up on a job row held past the
    // lease (an operator's transaction, a migration), and the email went out again.
    // One pool: the worker sets its own in each of its transactions.
    let jobs = backend.jobs(false);
    let working: String = sqlx::query_scalar(show).fetch_one(jobs.db()).await.unwrap();
    assert_eq!(working, "0");
    let after: String = sqlx::query_scalar(show)
        .fetch_one(backend.pool())
        .await
        .unwrap();
    assert_eq!(
        after, "1500ms",
        "the worker's setting stayed in its transaction"
    );
}
