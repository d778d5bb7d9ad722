//! Runs the example: the API on 127.0.0.1:3001, a worker, and (unless `PAYMENTS_URL` is set)
//! the fake payment provider, all on a SQLite file.
//!
//! ```sh
//! cargo run -p oncely-example-subscriptions
//! curl -i localhost:3001/v1/subscriptions -H 'Idempotency-Key: "sub-1"' \
//!   -H 'content-type: application/json' -d '{"customer":"cus_1","plan":"pro","amount_cents":2900}'
//! ```

use std::time::Duration;

use oncely::ServerSecret;
use oncely::store::sqlite::{SqliteKeyStore, connect_options};
use oncely_example_subscriptions::{CHARGE, ChargeHandler, FakeProvider, app, migrate};
use oncely_outbox::store::sqlite::SqliteJobStore;
use oncely_outbox::{Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "sqlite://subscriptions-example.db".into());
    let pool = sqlx::SqlitePool::connect_with(connect_options(&url)?).await?;
    let (keys, jobs) = (
        SqliteKeyStore::new(pool.clone()),
        SqliteJobStore::new(pool.clone()),
    );
    migrate(&keys, &jobs).await?;
    let payments = match std::env::var("PAYMENTS_URL") {
        Ok(url) => url,
        Err(_) => FakeProvider::default().start().await?,
    };
    let charge = ChargeHandler {
        client: oncely_outbox::http::client(Duration::from_secs(10))?,
        url: payments.clone(),
        pool,
    };
    let worker = Worker::new(jobs.clone(), WorkerConfig::default()).handle(CHARGE, charge);
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(worker.run(shutdown.clone()));
    // A real service reads its secret from configuration.
    let secret = ServerSecret::new(b"example-secret-change-me-in-production".to_vec())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    println!(
        "POST http://{}/v1/subscriptions (payments: {payments})",
        listener.local_addr()?
    );
    axum::serve(listener, app(keys, jobs, secret))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    shutdown.cancel();
    worker.await??;
    Ok(())
}
