//! The service's workers: how they share the pool with the API, and when they stop claiming.

use std::time::Duration;

use oncely_testdb::TestDb;
use serde_json::json;

use crate::support::{both_databases, spawn_app_on};

both_databases!(two_workers_on_a_pool_of_two_send_promptly_and_the_api_still_answers);

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
