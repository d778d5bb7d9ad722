//! The service's workers: how they share the pool with the API, and when they stop claiming.

use std::time::Duration;

use oncely_outbox::{JobStore, NewJob};
use oncely_server::accounts::Accounts;
use oncely_server::app::Application;
use oncely_server::mail::SIGNUP_NOTICE;
use oncely_testdb::TestDb;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{both_databases, count, on_backend, settings, spawn_app_on, start_inbox};

both_databases!(
    two_workers_on_a_pool_of_two_send_promptly_and_the_api_still_answers,
    serve_stops_claiming_at_the_shutdown_signal_not_after_the_http_drain,
);

/// Regression (issue 14, item 6): `--workers 2 --database-pool 2` on PostgreSQL gave both pool
/// connections to the workers' LISTENs for good: the signup waited for a connection and failed,
/// and a job stayed pending forever. The one listener has a connection of its own. (An hour
/// between polls: the email can only come by a wake-up.)
async fn two_workers_on_a_pool_of_two_send_promptly_and_the_api_still_answers(
    url: String,
    _db: TestDb,
) {
    let app = spawn_app_on(&url, |s| {
        s.workers = 2;
        s.database.pool = 2;
        s.poll_interval = Duration::from_secs(3600);
    })
    .await;
    let body = json!({ "email": "pool@example.com", "password": "correct horse battery" });
    let response = app.post("/v1/signup", "\"pool-of-two\"", &body).await;
    assert_eq!(response.status(), 202, "the API has a connection");
    let emails = app.emails_to("pool@example.com", 1).await;
    assert_eq!(emails.len(), 1, "sent promptly");
    assert_eq!(app.get("/readyz").await.status(), 200);
}

/// Regression (issue 14, item 7): `serve` cancelled its workers only after the HTTP drain, so
/// they kept claiming while a slow request held it open. Now they stop at the signal.
async fn serve_stops_claiming_at_the_shutdown_signal_not_after_the_http_drain(
    url: String,
    _db: TestDb,
) {
    on_backend!(url, stops_claiming_at_the_signal(&url));
}

async fn stops_claiming_at_the_signal<B: Accounts>(url: &str) {
    let (inbox, running) = start_inbox(oncely_inbox::Faults::default()).await;
    let mut settings = settings(url, &format!("smtp://{}", running.smtp_addr));
    // A worker that still ran would find the job within a poll or two.
    settings.poll_interval = Duration::from_millis(100);
    let app = Application::<B>::build(settings).await.unwrap();
    let addr = app.addr();
    let backend = app.backend().clone();
    let (signal, shutdown) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(app.run_until(async {
        let _ = shutdown.await;
    }));
    let client = oncely_testdb::http();
    let signup = client
        .post(format!("http://{addr}/v1/signup"))
        .header("idempotency-key", "\"before\"")
        .json(&json!({ "email": "before@example.com", "password": "correct horse battery" }))
        .send()
        .await
        .unwrap();
    assert_eq!(signup.status(), 202);
    inbox
        .wait_for("before@example.com", 1, Duration::from_secs(10))
        .await;
    assert_eq!(
        inbox.messages(Some("before@example.com")).len(),
        1,
        "the workers run"
    );

    // A request in flight: its handler reads a body that never ends (`100 Continue` says the
    // server is reading it), which holds the HTTP drain open.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(
        b"POST /v1/signup HTTP/1.1\r\nhost: oncely\r\nidempotency-key: \"slow\"\r\n\
          content-type: application/json\r\ncontent-length: 100\r\nexpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = [0; 25];
    slow.read_exact(&mut answer).await.unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 100 Continue"));

    signal.send(()).unwrap();
    // The drain has begun once the server accepts no more connections.
    tokio::time::timeout(Duration::from_secs(10), async {
        while TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the server stops accepting");
    let jobs = backend.jobs(false);
    let mut tx = backend.pool().begin().await.unwrap();
    let job = NewJob::new("after-the-signal", SIGNUP_NOTICE, json!({}));
    jobs.enqueue(&mut tx, &job).await.unwrap();
    tx.commit().await.unwrap();
    jobs.wake();
    // Ten polls' time while the drain is held open (wall clock: the server's workers poll in
    // real time).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!serving.is_finished(), "the drain is still open");
    drop(slow);
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the server stops once the request is gone")
        .unwrap()
        .unwrap();
    let attempts = count(
        url,
        "SELECT count(*) FROM oncely_outbox_attempts a JOIN oncely_outbox o ON o.id = a.job_id
          WHERE o.operation_key = 'after-the-signal'",
    )
    .await;
    assert_eq!(attempts, 0, "claimed after the shutdown signal");
}
