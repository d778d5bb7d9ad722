//! The HTTP application.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::config::ServeArgs;
use crate::database::Database;

/// A bound, ready-to-run server. Tests bind port 0 and read [`Application::addr`].
pub struct Application {
    listener: TcpListener,
    router: Router,
    database: Database,
}

impl Application {
    /// Connects to the database, applies migrations, binds the listener.
    pub async fn build(args: &ServeArgs) -> anyhow::Result<Self> {
        args.validate()?;
        // Resolved at start-up so that a missing production secret stops the process now.
        let _secret = args.server_secret()?;
        let database = Database::connect(&args.database.database_url).await?;
        database.migrate().await?;
        let listener = TcpListener::bind(args.bind)
            .await
            .with_context(|| format!("cannot listen on {}", args.bind))?;
        let router = router(database.clone());
        Ok(Self {
            listener,
            router,
            database,
        })
    }

    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The database in use.
    pub fn database(&self) -> &Database {
        &self.database
    }

    /// Serves until `shutdown` completes, then finishes in-flight requests.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await?;
        Ok(())
    }
}

fn router(database: Database) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(database)
}

async fn readyz(State(database): State<Database>) -> (StatusCode, String) {
    match database.ready().await {
        Ok(()) => (StatusCode::OK, "ready".into()),
        Err(error) => {
            tracing::warn!(%error, "not ready");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {error}"),
            )
        }
    }
}
