//! Start-up, health and readiness.

use oncely_server::app::Application;
use oncely_server::backend::Postgres;
use oncely_testdb::TestSqlite;

use crate::requests::{email, idempotent_post, smtp_inbox};
use crate::support::{Process, settings, spawn_app_on, spawn_binary};

#[tokio::test]
async fn health_and_readiness_answer_on_sqlite() {
    let db = TestSqlite::new();
    let app = spawn_app_on(db.url(), |_| {}).await;
    let health = app.get("/healthz").await;
    assert_eq!(health.status(), 200);
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap());
}

#[tokio::test]
async fn readiness_answers_on_postgres() {
    let db = crate::support::migrated_postgres().await;
    let app = spawn_app_on(db.url(), |_| {}).await;
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap());
}

#[tokio::test]
async fn an_unreachable_database_stops_start_up_with_a_clear_error() {
    let settings = settings(
        "postgres://nobody:pw@127.0.0.1:1/none",
        "smtp://127.0.0.1:1",
    );
    let error = Application::<Postgres>::build(settings)
        .await
        .err()
        .unwrap();
    let message = format!("{error:#}");
    assert!(
        message.starts_with(
            "DATABASE_URL=postgres://nobody:***@127.0.0.1:1/none: connection refused to 127.0.0.1:1"
        ),
        "{message}"
    );
    assert!(!message.contains(":pw@"));
}

#[tokio::test]
async fn metrics_show_request_outcomes_outbox_backlog_and_deliveries() {
    let db = TestSqlite::new();
    let app = spawn_app_on(db.url(), |_| {}).await;
    let body = email("metrics@example.com");
    app.post("/v1/signup", "m1", &body).await;
    app.post("/v1/signup", "m1", &body).await;
    app.emails_to("metrics@example.com", 1).await;
    let metrics = app.get("/metrics").await.text().await.unwrap();
    for needle in [
        r#"oncely_idempotency_requests_total{outcome="created",route="/v1/signup"}"#,
        r#"oncely_idempotency_requests_total{outcome="replayed",route="/v1/signup"}"#,
        "oncely_outbox_pending ",
        "oncely_outbox_oldest_pending_seconds ",
        r#"oncely_outbox_attempts_total{kind="email.verification",result="sent"}"#,
        r#"oncely_http_requests_total{route="/v1/signup",method="POST",status="202"}"#,
        "oncely_http_request_duration_seconds",
    ] {
        assert!(
            metrics.contains(needle),
            "{needle} missing from:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn every_response_carries_a_request_id_and_keeps_the_callers() {
    let db = TestSqlite::new();
    let app = spawn_app_on(db.url(), |_| {}).await;
    let generated = app.get("/healthz").await;
    assert_eq!(generated.headers()["x-request-id"].len(), 36, "a UUID");
    let given = app
        .client
        .get(format!("{}/healthz", app.base))
        .header("x-request-id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(given.headers()["x-request-id"], "abc-123");
}

/// Sends `signup` (answered 202), then stops the process: everything it logged.
async fn logs_after(signup: reqwest::RequestBuilder, mut process: Process) -> String {
    let response = signup.send().await.unwrap();
    assert_eq!(response.status(), 202);
    process.child.kill().await.unwrap();
    process.stderr.await.unwrap()
}

#[tokio::test]
async fn production_logs_are_json_lines_with_request_id_route_outcome_and_a_masked_address() {
    let db = TestSqlite::new();
    // Production runs on a migrated database only.
    crate::support::migrate(db.url()).await;
    let (_inbox, mailer) = smtp_inbox().await;
    let production = [
        ("ONCELY_ENV", "production"),
        ("ONCELY_PUBLIC_URL", "https://accounts.example.com"),
    ];
    let process = spawn_binary(db.url(), &mailer, &[], &production).await;
    let client = oncely_testdb::http();
    let signup = idempotent_post(&client, &process.base, "/v1/signup", "json-logs")
        .header("x-request-id", "req-42")
        .json(&email("logged@example.com"));
    let logs = logs_after(signup, process).await;
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        !lines.is_empty() && lines.len() == logs.lines().count(),
        "every line is JSON"
    );
    let outcome = lines
        .iter()
        .find(|l| l["fields"]["idempotency_outcome"] == "created")
        .expect("the idempotency outcome is logged");
    assert_eq!(outcome["fields"]["route"], "/v1/signup");
    assert_eq!(outcome["span"]["request_id"], "req-42");
    let signup = lines
        .iter()
        .find(|l| l["fields"]["message"] == "signup accepted")
        .unwrap();
    assert_eq!(signup["fields"]["email"], "l***@example.com");
    assert!(!logs.contains("logged@example.com"));
}

/// Text logs (development) written to a pipe or a file carry no ANSI colour codes: a log
/// collector would store `\x1b[32m INFO\x1b[0m` otherwise.
#[tokio::test]
async fn logs_to_a_pipe_carry_no_colour_codes() {
    let db = TestSqlite::new();
    let (_inbox, mailer) = smtp_inbox().await;
    let process = spawn_binary(db.url(), &mailer, &[], &[]).await;
    let client = oncely_testdb::http();
    let signup = idempotent_post(&client, &process.base, "/v1/signup", "plain-logs")
        .json(&email("plain@example.com"));
    let logs = logs_after(signup, process).await;
    assert!(logs.contains("INFO"), "text logs: {logs}");
    assert!(!logs.contains('\x1b'), "no escape codes: {logs}");
}
