//! The database: PostgreSQL or SQLite, chosen by the URL's scheme.

use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::AssertSqlSafe;

use crate::accounts::Accounts;
use oncely::store::postgres::PgKeyStore;
use oncely::store::sqlite::{SqliteKeyStore, connect_options};
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;

/// A connected database and the key store on it.
#[derive(Debug, Clone)]
pub enum Database {
    /// PostgreSQL: production.
    Postgres(PgKeyStore),
    /// SQLite: the embedded default.
    Sqlite(SqliteKeyStore),
}

impl Database {
    /// Connects with a small pool, for one-off commands; see [`Database::connect_pool`].
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        Self::connect_pool(url, 4).await
    }

    /// Connects with at most `max_connections` PostgreSQL connections (SQLite: at most 8); the
    /// error says which database could not be reached (never its password).
    pub async fn connect_pool(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool = PgPoolOptions::new()
                .max_connections(max_connections)
                // Start-up against an unreachable server fails in seconds, not half a minute.
                .acquire_timeout(Duration::from_secs(5))
                // A ping before every acquire is a round trip per request; ping only connections
                // that sat idle. A connection that died under load fails its request (503, retried
                // with the same key) and is discarded.
                .test_before_acquire(false)
                .before_acquire(|conn, meta| {
                    Box::pin(async move {
                        if meta.idle_for > Duration::from_secs(1) {
                            sqlx::Connection::ping(conn).await?;
                        }
                        Ok(true)
                    })
                })
                .connect(url)
                .await
                .with_context(|| format!("cannot connect to PostgreSQL at {}", redact(url)))?;
            Ok(Self::Postgres(PgKeyStore::new(pool)))
        } else if url.starts_with("sqlite:") {
            let pool = SqlitePoolOptions::new()
                .max_connections(8)
                .connect_with(connect_options(url)?)
                .await
                .with_context(|| format!("cannot open SQLite database {url}"))?;
            Ok(Self::Sqlite(SqliteKeyStore::new(pool)))
        } else {
            bail!(
                "DATABASE_URL must start with postgres:// or sqlite:// (got {})",
                redact(url)
            )
        }
    }

    /// Applies every migration: idempotency keys, outbox, accounts (each library keeps its own
    /// history table).
    pub async fn migrate(&self) -> anyhow::Result<()> {
        match self {
            Self::Postgres(store) => migrate_all(store).await,
            Self::Sqlite(store) => migrate_all(store).await,
        }
    }

    /// Ready to serve: reachable, and every migration this binary knows is applied.
    pub async fn ready(&self) -> anyhow::Result<()> {
        let expected = [
            (
                "_oncely_idempotency_migrations",
                oncely::store::postgres::migrator(),
            ),
            (
                "_oncely_outbox_migrations",
                oncely_outbox::store::postgres::migrator(),
            ),
            (
                "_oncely_server_migrations",
                crate::accounts::postgres::migrator(),
            ),
        ];
        for (table, migrator) in expected {
            let latest = migrator.iter().map(|m| m.version).max().unwrap_or(0);
            let query = AssertSqlSafe(format!(
                "SELECT COALESCE(MAX(version), 0) FROM {table} WHERE success"
            ));
            let applied: i64 = match self {
                Self::Postgres(store) => sqlx::query_scalar(query).fetch_one(store.pool()).await?,
                Self::Sqlite(store) => sqlx::query_scalar(query).fetch_one(store.pool()).await?,
            };
            if applied < latest {
                bail!(
                    "migrations pending in {table}: database at {applied}, binary expects {latest}"
                );
            }
        }
        Ok(())
    }

    /// A name for logs: `postgres` or `sqlite`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Postgres(_) => "postgres",
            Self::Sqlite(_) => "sqlite",
        }
    }
}

async fn migrate_all<A: Accounts>(store: &A) -> anyhow::Result<()> {
    use oncely_outbox::JobStore;
    store
        .migrate()
        .await
        .context("idempotency key migrations")?;
    store
        .jobs(false)
        .migrate()
        .await
        .context("outbox migrations")?;
    store.migrate_accounts().await.context("account migrations")
}

/// The URL with any password (in the user info or a `password=` parameter) replaced, for
/// messages.
pub fn redact(url: &str) -> String {
    let mut out = match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    };
    if let Some(at) = out.find("password=") {
        let start = at + "password=".len();
        let end = out[start..].find('&').map_or(out.len(), |e| start + e);
        out.replace_range(start..end, "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://u:hunter2@h:5432/d"),
            "postgres://u:***@h:5432/d"
        );
        assert_eq!(redact("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(redact("sqlite://x.db"), "sqlite://x.db");
        assert_eq!(
            redact("postgres://h/d?sslmode=require&password=hunter2&x=1"),
            "postgres://h/d?sslmode=require&password=***&x=1"
        );
    }
}
