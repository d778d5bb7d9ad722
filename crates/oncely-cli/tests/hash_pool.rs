//! Password hashing is bounded: with every hashing thread busy and the queue full, a signup
//! with a password answers 503 `busy` with `Retry-After`, its key stays free, and the retry
//! succeeds. Its own test binary: it saturates the process-wide hashing pool.

#![allow(unreachable_pub)]

#[allow(dead_code, unused)]
#[path = "support/mod.rs"]
mod support;

use support::requests;

use std::sync::{Arc, Mutex, mpsc};

use argon2::{PasswordHash, PasswordVerifier};
use oncely_server::password;
use serde_json::json;

use requests::{client_from, idempotent_post};

/// A job of the pool that waits until released.
type HeldJob = std::pin::Pin<Box<dyn Future<Output = Result<(), password::HashError>> + Send>>;

/// A client's whole share of the pool, taken by jobs that wait until released.
struct HeldShare {
    release: mpsc::Sender<()>,
    jobs: Vec<HeldJob>,
}

impl HeldShare {
    fn take(client: &str) -> Self {
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let mut jobs: Vec<HeldJob> = Vec::new();
        loop {
            let released = Arc::clone(&released);
            match password::pool().try_run_for(Some(client), move || {
                released.lock().unwrap().recv().unwrap();
            }) {
                Ok(job) => jobs.push(Box::pin(job)),
                Err(password::HashError::Overloaded) => break,
                Err(other) => panic!("{other}"),
            }
        }
        Self { release, jobs }
    }

    async fn release(self) {
        for _ in 0..self.jobs.len() {
            self.release.send(()).unwrap();
        }
        for job in self.jobs {
            job.await.unwrap();
        }
    }
}

/// The tests of this binary take the process-wide pool in turn.
static POOL_IN_USE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn a_saturated_hashing_pool_answers_503_busy_with_retry_after_and_frees_the_key() {
    let _pool = POOL_IN_USE.lock().await;
    let (url, _db) = support::postgres_db().await;
    let app = support::spawn_app_on(&url, |_| {}).await;
    let body = json!({ "email": "busy@example.com", "password": "correct horse battery" });

    // Occupy every hashing thread, then fill the queue.
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(password::MAX_THREADS);
    let (started, is_started) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let released = Arc::new(Mutex::new(released));
    let mut blockers = Vec::new();
    for _ in 0..threads {
        let (started, released) = (started.clone(), Arc::clone(&released));
        blockers.push(
            password::pool()
                .try_run(move || {
                    started.send(()).unwrap();
                    released.lock().unwrap().recv().unwrap();
                })
                .unwrap(),
        );
    }
    for _ in 0..threads {
        is_started.recv().unwrap();
    }
    let mut queued = Vec::new();
    for _ in 0..threads * password::QUEUE_PER_THREAD {
        queued.push(password::pool().try_run(|| ()).unwrap());
    }

    let refused = app.post("/v1/signup", "busy-1", &body).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let problem: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(
        problem["type"], "https://oncely.dev/problems/busy",
        "{problem}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_users").await,
        0,
        "nothing ran"
    );

    for _ in 0..threads {
        release.send(()).unwrap();
    }
    for blocker in blockers {
        blocker.await.unwrap();
    }
    for job in queued {
        job.await.unwrap();
    }

    // The key was released: the retry runs, and the stored hash verifies.
    let retried = app.post("/v1/signup", "busy-1", &body).await;
    assert_eq!(retried.status(), 202);
    assert!(retried.headers().get("idempotent-replayed").is_none());
    let phc: String = {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        // A signup's password waits on its verification token until the owner re-enters it.
        sqlx::query_scalar(
            "SELECT password_hash FROM oncely_tokens WHERE flow = 'verification' AND password_hash IS NOT NULL",
        )
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    let params = argon2::Params::new(19 * 1024, 2, 1, None).unwrap();
    let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    assert!(
        argon
            .verify_password(b"correct horse battery", &PasswordHash::new(&phc).unwrap())
            .is_ok()
    );
}

/// One client holding its share of the pool (here: jobs of 127.0.0.2 that do not end) gets 503
/// `busy`; another client's password signup still runs.
#[tokio::test]
async fn one_client_flooding_password_requests_leaves_room_for_others() {
    let _pool = POOL_IN_USE.lock().await;
    let (url, _db) = support::postgres_db().await;
    let app = support::spawn_app_on(&url, |_| {}).await;
    // Take 127.0.0.2's whole share with jobs that wait.
    let held = HeldShare::take("127.0.0.2");
    assert!(!held.jobs.is_empty());
    let signup = |source: &'static str, email: &'static str| {
        let base = app.base.clone();
        async move {
            idempotent_post(
                &client_from(source),
                &base,
                "/v1/signup",
                &format!("fair-{email}"),
            )
            .json(&json!({ "email": email, "password": "correct horse battery" }))
            .send()
            .await
            .unwrap()
        }
    };
    let flooder = signup("127.0.0.2", "flooder@example.com").await;
    assert_eq!(
        flooder.status(),
        503,
        "the flooding client is over its share"
    );
    // Another client is admitted, not refused (its hash waits behind the held jobs until they
    // are released).
    let other = tokio::spawn(signup("127.0.0.3", "other@example.com"));
    held.release().await;
    assert_eq!(other.await.unwrap().status(), 202, "another client gets in");
}

/// Regression: re-entering a signup's password at its link while the hashing pool is busy
/// counted an attempt each time (the count came before the check, and a check that did not run
/// was never taken back): a person retrying a few times on a busy server was told "too many
/// wrong passwords" and could no longer adopt the password. A check that did not run is no
/// attempt.
#[tokio::test]
async fn busy_answers_at_a_link_do_not_use_up_its_password_attempts() {
    let _pool = POOL_IN_USE.lock().await;
    let (url, _db) = support::postgres_db().await;
    let app = support::spawn_app_on(&url, |_| {}).await;
    let password = "correct horse battery";
    let ada = "ada@example.com";
    let signup = idempotent_post(&client_from("127.0.0.3"), &app.base, "/v1/signup", "s1")
        .json(&json!({ "email": ada, "password": password }))
        .send()
        .await
        .unwrap();
    assert_eq!(signup.status(), 202);
    let token = support::token_in(&app.emails_to(ada, 1).await[0]);
    // 127.0.0.2's whole share of the pool taken: its checks do not run.
    let held = HeldShare::take("127.0.0.2");
    let verify = || {
        idempotent_post(&client_from("127.0.0.2"), &app.base, "/v1/verify", "v1")
            .json(&json!({ "token": token, "password": password }))
            .send()
    };
    let attempts = oncely_server::routes::verification::PASSWORD_ATTEMPTS + 3;
    for _ in 0..attempts {
        let busy = verify().await.unwrap();
        assert_eq!(busy.status(), 503);
    }
    held.release().await;
    let verified = verify().await.unwrap();
    let status = verified.status();
    let body: serde_json::Value = verified.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["password_set"], true, "{body}");
}
