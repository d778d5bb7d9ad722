//! Start-up: reading the command line (an error names the environment variable that was set),
//! opening the database as each command needs it (migrating it on purpose, or checking that its
//! schema is this binary's), and the one line an error prints.
//!
//! Who migrates: `oncely migrate`, and `serve` and `worker` in development. Everything else —
//! `serve` and `worker` in production, the operator commands — only reads the migration
//! histories and refuses, in one line, a database that is not migrated or is behind this
//! binary (one a newer release migrated runs, with a warning: migrations only add); so a role
//! that may only read and write rows runs them.

use std::fmt;

use anyhow::bail;
use sqlx::migrate::MigrateError;

use crate::accounts::Accounts;
use crate::backend::{Create, Location, MIGRATION_LIBRARIES, MIGRATION_TABLES, redact};
use crate::environment::Environment;
// Where it was before the secret had a module of its own (the end-to-end suite names it here).
pub use crate::secret::check_secret;

/// Where one library's migration history stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// What the history holds ("outbox").
    pub library: &'static str,
    /// Whether its table exists.
    pub exists: bool,
    /// How many of the migrations this binary knows are applied.
    pub applied: u64,
    /// How many migrations this binary knows.
    pub known: u64,
    /// Applied migrations this binary does not know (a newer release ran them).
    pub unknown: u64,
    /// The newest applied version (0: none).
    pub at: i64,
    /// The newest version this binary knows.
    pub latest: i64,
}

impl History {
    fn behind(&self) -> bool {
        self.applied < self.known
    }
}

/// The three migration histories of a database: idempotency keys, outbox, accounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema(pub Vec<History>);

/// Where a database's schema stands against this binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaState {
    /// No oncely table at all.
    Empty,
    /// A migration this binary knows is missing.
    Behind,
    /// Every migration this binary knows is applied, and some it does not know too.
    Ahead,
    /// Exactly this binary's migrations.
    Current,
}

impl Schema {
    /// Reads the histories (nothing is created).
    pub async fn read<B: Accounts>(backend: &B) -> anyhow::Result<Self> {
        let mut histories = Vec::new();
        for ((library, table), migrator) in MIGRATION_LIBRARIES
            .into_iter()
            .zip(MIGRATION_TABLES)
            .zip(B::migrators())
        {
            let versions: Vec<i64> = migrator.iter().map(|m| m.version).collect();
            let latest = versions.iter().copied().max().unwrap_or(0);
            let list = versions
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let mut history = History {
                library,
                exists: backend.scalar(B::has_table(table)).await? > 0,
                applied: 0,
                known: versions.len() as u64,
                unknown: 0,
                at: 0,
                latest,
            };
            if history.exists {
                let count = |filter: String| {
                    backend.scalar(format!(
                        "SELECT COUNT(*) FROM {table} WHERE success AND {filter}"
                    ))
                };
                history.applied = count(format!("version IN ({list})")).await?.unsigned_abs();
                history.unknown = count(format!("version NOT IN ({list})"))
                    .await?
                    .unsigned_abs();
                history.at = backend
                    .scalar(format!(
                        "SELECT COALESCE(MAX(version), 0) FROM {table} WHERE success"
                    ))
                    .await?;
            }
            histories.push(history);
        }
        Ok(Self(histories))
    }

    /// Where it stands.
    pub fn state(&self) -> SchemaState {
        if self.0.iter().all(|h| !h.exists) {
            SchemaState::Empty
        } else if self.0.iter().any(History::behind) {
            SchemaState::Behind
        } else if self.0.iter().any(|h| h.unknown > 0) {
            SchemaState::Ahead
        } else {
            SchemaState::Current
        }
    }

    /// What differs, for messages: "outbox at 0006, this binary needs 0007".
    fn differences(&self, state: SchemaState) -> String {
        self.0
            .iter()
            .filter(|h| match state {
                SchemaState::Behind => h.behind(),
                _ => h.unknown > 0,
            })
            .map(|h| {
                let (verb, version) = match state {
                    SchemaState::Behind => ("needs", h.latest),
                    _ => ("knows up to", h.latest),
                };
                format!(
                    "{} at {}, this binary {verb} {}",
                    h.library,
                    version_name(h.at),
                    version_name(version)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// `Ok` if this binary may run on the schema; else the one line that says why not and
    /// what to do. A schema a newer release migrated is accepted, with a warning: migrations
    /// only add, and an old process restarted during a rolling upgrade must start.
    pub fn check(&self, url: &str) -> anyhow::Result<()> {
        match self.state() {
            SchemaState::Current => Ok(()),
            SchemaState::Empty => bail!(
                "DATABASE_URL={} holds no oncely tables: is DATABASE_URL right? run `oncely migrate`",
                redact(url)
            ),
            SchemaState::Behind => bail!(
                "the database is not migrated to this binary ({}): run `oncely migrate`",
                self.differences(SchemaState::Behind)
            ),
            SchemaState::Ahead => {
                tracing::warn!(
                    "the database has migrations this binary does not know ({}): a newer release migrated it",
                    self.differences(SchemaState::Ahead)
                );
                Ok(())
            }
        }
    }
}

/// `0007`.
pub fn version_name(version: i64) -> String {
    format!("{version:04}")
}

/// What `oncely migrate` did, per library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// Before.
    pub before: Schema,
    /// After.
    pub after: Schema,
}

impl Migrated {
    /// Per library: how many migrations this run applied, and where its history is now.
    pub fn libraries(&self) -> impl Iterator<Item = (u64, &History)> {
        self.before
            .0
            .iter()
            .zip(&self.after.0)
            .map(|(before, after)| (after.applied.saturating_sub(before.applied), after))
    }

    /// How many migrations this run applied, over every library.
    pub fn applied(&self) -> u64 {
        self.libraries().map(|(applied, _)| applied).sum()
    }
}

impl fmt::Display for Migrated {
    /// One line per library: `outbox: 1 applied, schema at 0007` or `outbox: up to date
    /// (schema at 0006)`; then a line with the total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (applied, after) in self.libraries() {
            let at = version_name(after.at);
            if applied == 0 {
                write!(f, "{:<17} up to date (schema at {at})", after.library)?;
            } else {
                write!(f, "{:<17} {applied} applied, schema at {at}", after.library)?;
            }
            if after.unknown > 0 {
                write!(
                    f,
                    "; {} newer migration(s) this binary does not know",
                    after.unknown
                )?;
            }
            writeln!(f)?;
        }
        match self.applied() {
            0 => writeln!(f, "migrations: up to date"),
            total => writeln!(f, "migrations: {total} applied"),
        }
    }
}

/// Applies every migration this binary knows (`oncely migrate`; `serve` and `worker` in
/// development), and says what changed.
pub async fn migrate<B: Accounts>(backend: &B) -> anyhow::Result<Migrated> {
    let before = Schema::read(backend).await?;
    let pool = backend.migration_pool().await?;
    for (library, migrator) in MIGRATION_LIBRARIES.into_iter().zip(B::migrators()) {
        if let Err(error) = migrator.run(&pool).await {
            B::done_migrating(pool).await;
            return Err(migration_error(library, &error));
        }
    }
    B::done_migrating(pool).await;
    let after = Schema::read(backend).await?;
    Ok(Migrated { before, after })
}

/// One line for a failed migration: the database's own message, and what to do about the
/// usual cause.
fn migration_error(library: &str, error: &MigrateError) -> anyhow::Error {
    let database = match error {
        MigrateError::Execute(sqlx::Error::Database(e))
        | MigrateError::ExecuteMigration(sqlx::Error::Database(e), _) => Some(e),
        _ => None,
    };
    match database {
        // insufficient_privilege
        Some(e) if e.code().as_deref() == Some("42501") => anyhow::anyhow!(
            "the {library} migrations need a role that may create tables ({}): run `oncely migrate` as the schema's owner; serving needs only SELECT, INSERT, UPDATE, DELETE",
            e.message()
        ),
        Some(e) => anyhow::anyhow!("the {library} migrations failed: {}", e.message()),
        None => anyhow::anyhow!("the {library} migrations failed: {error}"),
    }
}

/// Opens the database for `serve` or `worker`: in development it is created and migrated
/// (a schema a newer release migrated is accepted, with a warning); in production nothing is
/// created or migrated, and a schema behind this binary's is refused (a newer release's is
/// served with a warning: migrations only add, and a rolling upgrade restarts old processes).
pub async fn open_to_serve<B: Accounts>(
    at: &Location,
    pool: u32,
    environment: Environment,
) -> anyhow::Result<B> {
    let url = at.url.as_str();
    match environment {
        Environment::Development => {
            let backend = B::open(at, pool, Create::IfMissing).await?;
            let migrated = migrate(&backend).await?;
            for (applied, after) in migrated.libraries() {
                if applied > 0 {
                    tracing::info!(
                        library = after.library,
                        applied,
                        schema = version_name(after.at),
                        "migrated (development; production runs `oncely migrate`)"
                    );
                }
            }
            migrated.after.check(url)?;
            Ok(backend)
        }
        Environment::Production => {
            let backend = B::open(at, pool, Create::Never).await?;
            // A newer release's schema is served (with a warning): during a rolling upgrade an
            // old process that restarts after `oncely migrate` must still start.
            Schema::read(&backend).await?.check(url)?;
            if let Some(warning) = B::PRODUCTION_WARNING {
                tracing::warn!("{warning}");
            }
            warn_if_commits_are_not_durable(&backend).await?;
            Ok(backend)
        }
    }
}

/// Warns when the database acknowledges commits it may lose in a crash (`synchronous_commit =
/// off`): an acknowledged signup could vanish, and an outbox attempt's point of no return be
/// forgotten after its email left — then sent again.
async fn warn_if_commits_are_not_durable<B: Accounts>(backend: &B) -> anyhow::Result<()> {
    if let Some(statement) = B::LOSES_ACKNOWLEDGED_COMMITS
        && backend.scalar(statement.to_owned()).await? > 0
    {
        tracing::warn!(
            "synchronous_commit is off on this database: a crash can lose commits oncely already acknowledged — a signup answered 202, an email's point of no return (then sent twice); set it to on (the default) for oncely's role or database"
        );
    }
    Ok(())
}

/// Opens the database for an operator command (`outbox …`, `key show`, `tenant create`,
/// `prune`): nothing is created or migrated; a database without oncely's tables, or behind
/// this binary, is refused in one line.
pub async fn open_existing<B: Accounts>(at: &Location, pool: u32) -> anyhow::Result<B> {
    let backend = B::open(at, pool, Create::Never).await?;
    Schema::read(&backend).await?.check(&at.url)?;
    Ok(backend)
}
