//! `POST /payments` made idempotent in a few lines, on SQLite.
//!
//! ```sh
//! cargo run -p oncely --example payments
//! curl -i localhost:3000/payments -H 'Idempotency-Key: "pay-1"' -H 'content-type: application/json' -d '{"amount":10}'
//! # the same again: same body, `Idempotent-Replayed: true`, still one row
//! ```
//!
//! The handler takes the layer's transaction, so the payment row and the stored response commit
//! together: a retry can never see one without the other. `GET /payments/count` (outside the
//! layer) answers `{"count": n}`: how many payments were made, a probe for `oncely check`.
//!
//! `PAYMENTS_ADDR` sets the listen address (default `127.0.0.1:3000`; `127.0.0.1:0` for any free
//! port, which it prints) and `PAYMENTS_DB` the SQLite database (default
//! `sqlite://payments-example.db`).

use axum::http::StatusCode;
use axum::routing::{get, post};
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
    let db = std::env::var("PAYMENTS_DB").unwrap_or_else(|_| "sqlite://payments-example.db".into());
    let addr = std::env::var("PAYMENTS_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let pool = sqlx::SqlitePool::connect_with(connect_options(&db)?).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let store = SqliteKeyStore::new(pool.clone());
    store.migrate().await?;
    // A real service reads this from its configuration (ONCELY_SECRET).
    let secret = ServerSecret::new(b"example-secret-change-me-in-production".to_vec())?;

    let app = Router::new()
        .route("/payments", post(create_payment))
        .route_layer(IdempotencyLayer::transactional(store, secret))
        // Added after the layer: a plain GET, no key.
        .route(
            "/payments/count",
            get(move || async move {
                let count: i64 = sqlx::query_scalar("SELECT count(*) FROM payments")
                    .fetch_one(&pool)
                    .await
                    .expect("count payments");
                Json(json!({ "count": count }))
            }),
        );

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "POST http://{}/payments with an Idempotency-Key header",
        listener.local_addr()?
    );
    axum::serve(listener, app).await?;
    Ok(())
}
