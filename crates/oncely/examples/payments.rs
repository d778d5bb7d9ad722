//! `POST /payments` made idempotent in a few lines, on SQLite.
//!
//! ```sh
//! cargo run -p oncely --example payments
//! curl -i localhost:3000/payments -H 'Idempotency-Key: "pay-1"' -H 'content-type: application/json' -d '{"amount":10}'
//! # the same again: same body, `Idempotent-Replayed: true`, still one row
//! ```
//!
//! The handler takes the layer's transaction, so the payment row and the stored response commit
//! together: a retry can never see one without the other.

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use oncely::store::KeyStore;
use oncely::store::sqlite::{SqliteKeyStore, connect_options};
use oncely::{IdempotencyLayer, IdempotentTx, ServerSecret, TxAborted};
use serde_json::{Value, json};
use sqlx::Sqlite;

async fn create_payment(
    tx: IdempotentTx<Sqlite>,
    Json(body): Json<Value>,
) -> Result<(StatusCode, Json<Value>), TxAborted> {
    let amount = body["amount"].as_i64().unwrap_or(0);
    let mut conn = tx.lock().await?;
    let id: i64 = sqlx::query_scalar("INSERT INTO payments (amount) VALUES (?1) RETURNING id")
        .bind(amount)
        .fetch_one(&mut *conn)
        .await
        .expect("insert payment");
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": id, "amount": amount })),
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let pool =
        sqlx::SqlitePool::connect_with(connect_options("sqlite://payments-example.db")?).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let store = SqliteKeyStore::new(pool);
    store.migrate().await?;
    // A real service reads this from its configuration (ONCELY_SECRET).
    let secret = ServerSecret::new(b"example-secret-change-me-in-production".to_vec())?;

    let app = Router::new()
        .route("/payments", post(create_payment))
        .route_layer(IdempotencyLayer::transactional(store, secret));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!(
        "POST http://{}/payments with an Idempotency-Key header",
        listener.local_addr()?
    );
    axum::serve(listener, app).await?;
    Ok(())
}
