//! Start-up, health and readiness.

use oncely_server::app::Application;
use oncely_testdb::{TestPostgres, TestSqlite};

use crate::support::{serve_args, spawn_app_on};

#[tokio::test]
async fn health_and_readiness_answer_on_sqlite() {
    let db = TestSqlite::new();
    let app = spawn_app_on(db.url(), &[]).await;
    let health = app
        .client
        .get(format!("{}/healthz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let ready = app
        .client
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap());
}

#[tokio::test]
async fn readiness_answers_on_postgres() {
    let db = TestPostgres::new().await;
    let app = spawn_app_on(db.url(), &[]).await;
    let ready = app
        .client
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap());
}

#[tokio::test]
async fn an_unreachable_database_stops_start_up_with_a_clear_error() {
    let args = serve_args(
        "postgres://nobody:pw@127.0.0.1:1/none",
        "smtp://127.0.0.1:1",
        &[],
    );
    let error = Application::build(&args).await.err().unwrap();
    let message = format!("{error:#}");
    assert!(
        message.contains("cannot connect to PostgreSQL at postgres://nobody:***@127.0.0.1:1/none"),
        "{message}"
    );
    assert!(!message.contains(":pw@"));
}
