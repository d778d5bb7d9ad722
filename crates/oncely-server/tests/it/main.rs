//! The service over real HTTP, on a random port, with a fresh database.

use clap::Parser;
use oncely_server::app::Application;
use oncely_server::config::{Cli, Command, ServeArgs};
use oncely_testdb::{TestPostgres, TestSqlite};

fn args(database_url: &str) -> ServeArgs {
    let cli = Cli::try_parse_from([
        "oncely",
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--database-url",
        database_url,
    ])
    .unwrap();
    let Command::Serve(args) = cli.command else {
        unreachable!()
    };
    args
}

async fn spawn_app(database_url: &str) -> String {
    let app = Application::build(&args(database_url))
        .await
        .expect("the app starts");
    let addr = app.addr();
    tokio::spawn(app.run_until(std::future::pending()));
    format!("http://{addr}")
}

#[tokio::test]
async fn health_and_readiness_answer_on_sqlite() {
    let db = TestSqlite::new();
    let base = spawn_app(db.url()).await;
    let health = oncely_testdb::http()
        .get(format!("{base}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let ready = oncely_testdb::http()
        .get(format!("{base}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap());
}

#[tokio::test]
async fn readiness_answers_on_postgres() {
    let db = TestPostgres::new().await;
    let base = spawn_app(db.url()).await;
    let ready = oncely_testdb::http()
        .get(format!("{base}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap());
}

#[tokio::test]
async fn an_unreachable_database_stops_start_up_with_a_clear_error() {
    let error = Application::build(&args("postgres://nobody:pw@127.0.0.1:1/none"))
        .await
        .err()
        .unwrap();
    let message = format!("{error:#}");
    assert!(
        message.contains("cannot connect to PostgreSQL at postgres://nobody:***@127.0.0.1:1/none"),
        "{message}"
    );
    assert!(!message.contains(":pw@"));
}
