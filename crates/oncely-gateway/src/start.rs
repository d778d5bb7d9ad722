//! The gateway's own start-up: its database opened with the key store's migrations alone (it
//! keeps only idempotency keys and the shared secret's check, no account table), and its server
//! secret checked against the other processes of the database.
//!
//! Who migrates: the gateway in development (the key store's history only); in production
//! nothing is created or migrated — `oncely migrate` runs first — and a key store behind this
//! binary's is refused in one line.

use oncely::ServerSecret;
use oncely::store::KeyStore;
use oncely::store::shared_secret::{SharedSecretStore, share_secret};
use oncely::store::{Dialect, SqlKeyStore};
use oncely_sql::open::{Create, Location, Open, warn_if_commits_are_not_durable};
use oncely_sql::schema::{Library, Schema, migrate};
use secrecy::SecretString;

/// The migrations the gateway's database needs: the key store's.
pub fn libraries<DB: Dialect>() -> [Library; 1] {
    [Library {
        name: "idempotency keys",
        migrator: DB::migrator(),
    }]
}

/// How the gateway treats its database's schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schemas {
    /// Development: the database (a SQLite file too) is created and the key store's history
    /// migrated.
    Migrate,
    /// Production: nothing is created or migrated; a key store behind this binary's is refused.
    Require,
}

/// The key store of a gateway on the database `at`, with at most `max_connections`
/// connections, and the server secret its processes share: `secret` as given, or — `generated`
/// in development, when none was given — the one the database keeps. A process whose secret
/// is not the one the other processes of the database use is refused.
pub async fn open<DB>(
    at: &Location,
    max_connections: u32,
    schemas: Schemas,
    (secret, generated): (ServerSecret, Option<SecretString>),
) -> anyhow::Result<(SqlKeyStore<DB>, ServerSecret)>
where
    DB: Open + Dialect,
    SqlKeyStore<DB>: KeyStore + SharedSecretStore,
{
    let libraries = libraries::<DB>();
    let opened = match schemas {
        Schemas::Migrate => {
            let opened = DB::open(at, max_connections, Create::IfMissing).await?;
            let migrated = migrate(&opened, &libraries).await?;
            migrated.log_development();
            migrated.after.require_current(&at.url)?;
            opened
        }
        Schemas::Require => {
            let opened = DB::open(at, max_connections, Create::Never).await?;
            Schema::read(&opened.db, &libraries)
                .await?
                .require_current(&at.url)?;
            if let Some(warning) = DB::PRODUCTION_WARNING {
                tracing::warn!("{warning}");
            }
            warn_if_commits_are_not_durable(&opened.db).await?;
            opened
        }
    };
    let keys = SqlKeyStore::on(opened.db.clone());
    let secret = share_secret(&keys, &opened.db, secret, generated.as_ref()).await?;
    Ok((keys, secret))
}
