//! Start-up: opening the service's database as each command needs it (migrating it on purpose,
//! or requiring that its schema is this binary's). How a database opens, and its migration
//! histories, are `oncely_sql`'s (`open`, `schema`), which the gateway's start-up shares.
//!
//! Who migrates: `oncely migrate`, and `serve` and `worker` in development. Everything else —
//! `serve` and `worker` in production, the operator commands — only reads the migration
//! histories and refuses, in one line, a database that is not migrated or is behind this
//! binary (one a newer release migrated runs, with a warning: migrations only add); so a role
//! that may only read and write rows runs them.

use oncely_sql::open::Open;
use oncely_sql::schema::{Migrated, Schema};

use crate::backend::{Backend, Create, Location};
use crate::environment::Environment;

/// Reads the three histories of the service's database (nothing is created).
pub async fn schema<B: Backend>(backend: &B) -> anyhow::Result<Schema> {
    Ok(Schema::read(backend.db(), &B::libraries()).await?)
}

/// Applies every migration this binary knows (`oncely migrate`; `serve` and `worker` in
/// development), and says what changed.
pub async fn migrate<B: Backend>(backend: &B) -> anyhow::Result<Migrated> {
    Ok(oncely_sql::schema::migrate(backend.opened(), &B::libraries()).await?)
}

/// Opens the database for `serve` or `worker`: in development it is created and migrated
/// (a schema a newer release migrated is accepted, with a warning); in production nothing is
/// created or migrated, and a schema behind this binary's is refused (a newer release's is
/// served with a warning: migrations only add, and a rolling upgrade restarts old processes).
pub async fn open_to_serve<B: Backend>(
    at: &Location,
    pool: u32,
    environment: Environment,
) -> anyhow::Result<B> {
    let url = at.url.as_str();
    match environment {
        Environment::Development => {
            let backend = B::open(at, pool, Create::IfMissing).await?;
            let migrated = migrate(&backend).await?;
            migrated.log_development();
            migrated.after.require_current(url)?;
            Ok(backend)
        }
        Environment::Production => {
            let backend = B::open(at, pool, Create::Never).await?;
            // A newer release's schema is served (with a warning): during a rolling upgrade an
            // old process that restarts after `oncely migrate` must still start.
            schema(&backend).await?.require_current(url)?;
            if let Some(warning) = <B::Database as Open>::PRODUCTION_WARNING {
                tracing::warn!("{warning}");
            }
            oncely_sql::open::warn_if_commits_are_not_durable(backend.db()).await?;
            Ok(backend)
        }
    }
}

/// What a database holds of the service's migration histories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// All three: a service's database.
    Service,
    /// The key store's alone: a gateway's database (one that `oncely gateway` migrated in
    /// development; `oncely migrate` migrates all three).
    KeysOnly,
}

/// Opens the database for an operator command that needs the key store (`key show`, `prune`),
/// as [`open_existing`] does; a gateway's database, which holds the key store's history alone,
/// is accepted too, and said so.
pub async fn open_for_keys<B: Backend>(at: &Location, pool: u32) -> anyhow::Result<(B, Holds)> {
    let backend = B::open(at, pool, Create::Never).await?;
    let schema = schema(&backend).await?;
    if let [keys, others @ ..] = schema.0.as_slice()
        && keys.exists
        && others.iter().all(|history| !history.exists)
    {
        Schema(vec![keys.clone()]).require_current(&at.url)?;
        return Ok((backend, Holds::KeysOnly));
    }
    schema.require_current(&at.url)?;
    Ok((backend, Holds::Service))
}

/// Opens the database for an operator command (`outbox …`, `key show`, `tenant create`,
/// `prune`): nothing is created or migrated; a database without oncely's tables, or behind
/// this binary, is refused in one line.
pub async fn open_existing<B: Backend>(at: &Location, pool: u32) -> anyhow::Result<B> {
    let backend = B::open(at, pool, Create::Never).await?;
    schema(&backend).await?.require_current(&at.url)?;
    Ok(backend)
}
