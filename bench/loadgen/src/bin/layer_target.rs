//! The layer-overhead target: one trivial handler served on PostgreSQL, `/plain` (and `/pass`)
//! without the Idempotency-Key layer and `/keyed` behind its generic mode. `bench/run` also puts
//! `oncely gateway` in front of it (protecting `/plain`, passing `/pass` through).

use axum::Router;
use axum::routing::post;
use oncely::store::KeyStore;
use oncely::store::postgres::PgKeyStore;
use oncely::{IdempotencyLayer, ServerSecret};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")?;
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:8091".into());
    // The pool as the library recommends it (and `oncely serve` has it): no ping before every
    // acquire.
    let pool = oncely::store::postgres::pool_options()
        .max_connections(32)
        .connect(&url)
        .await?;
    let store = PgKeyStore::new(pool);
    store.migrate().await?;
    let secret = ServerSecret::new(b"bench-secret-bench-secret-bench-secret".to_vec())?;
    let handler = || async {
        (
            axum::http::StatusCode::CREATED,
            axum::Json(serde_json::json!({ "ok": true })),
        )
    };
    let app = Router::new()
        .route("/keyed", post(handler))
        .route_layer(IdempotencyLayer::generic(store, secret))
        .route("/plain", post(handler))
        .route("/pass", post(handler));
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("layer target on http://{bind}");
    axum::serve(listener, app).await?;
    Ok(())
}
