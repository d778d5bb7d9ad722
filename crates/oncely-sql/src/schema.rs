//! The migration histories of a database: where each library's stands against this binary
//! ([`Schema::read`]), whether a process may run on it ([`Schema::require_current`]), and
//! applying them ([`migrate`]). Each library keeps its own history table, so each process opens
//! only the histories it needs: the service all of its own, the gateway the key store's alone.

use std::fmt;

use sqlx::migrate::{MigrateError, Migrator};

use crate::Db;
use crate::open::{Open, Opened, StartError, redact, refuse};

/// One library's migrations, with what they hold for people ("outbox").
#[derive(Debug)]
pub struct Library {
    /// What the history holds, for people.
    pub name: &'static str,
    /// Its migrations, with their own history table.
    pub migrator: Migrator,
}

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

/// The histories of the libraries a process runs on, in its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema(pub Vec<History>);

/// Where a database's schema stands against this binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaState {
    /// No table of these histories at all.
    Empty,
    /// A migration this binary knows is missing.
    Behind,
    /// Every migration this binary knows is applied, and some it does not know too.
    Ahead,
    /// Exactly this binary's migrations.
    Current,
}

impl Schema {
    /// Reads the histories of `libraries` (nothing is created).
    pub async fn read<DB: Open>(db: &Db<DB>, libraries: &[Library]) -> Result<Self, sqlx::Error> {
        let mut histories = Vec::new();
        for library in libraries {
            let table = &library.migrator.table_name;
            let versions: Vec<i64> = library.migrator.iter().map(|m| m.version).collect();
            let latest = versions.iter().copied().max().unwrap_or(0);
            let list = versions
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let mut history = History {
                library: library.name,
                exists: DB::scalar(db, DB::has_table(table)).await? > 0,
                applied: 0,
                known: versions.len() as u64,
                unknown: 0,
                at: 0,
                latest,
            };
            if history.exists {
                let count = |filter: String| {
                    DB::scalar(
                        db,
                        format!("SELECT COUNT(*) FROM {table} WHERE success AND {filter}"),
                    )
                };
                history.applied = count(format!("version IN ({list})")).await?.unsigned_abs();
                history.unknown = count(format!("version NOT IN ({list})"))
                    .await?
                    .unsigned_abs();
                history.at = DB::scalar(
                    db,
                    format!("SELECT COALESCE(MAX(version), 0) FROM {table} WHERE success"),
                )
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
    pub fn require_current(&self, url: &str) -> Result<(), StartError> {
        match self.state() {
            SchemaState::Current => Ok(()),
            SchemaState::Empty => refuse!(
                "DATABASE_URL={} holds no oncely tables: is DATABASE_URL right? run `oncely migrate`",
                redact(url)
            ),
            SchemaState::Behind => refuse!(
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

/// What a migration run did, per library.
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

    /// Logs each library this run migrated (development: the process migrates at start).
    pub fn log_development(&self) {
        for (applied, after) in self.libraries() {
            if applied > 0 {
                tracing::info!(
                    library = after.library,
                    applied,
                    schema = version_name(after.at),
                    "migrated (development; production runs `oncely migrate`)"
                );
            }
        }
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

/// Applies every migration of `libraries`, in their order, and says what changed.
pub async fn migrate<DB: Open>(
    opened: &Opened<DB>,
    libraries: &[Library],
) -> Result<Migrated, StartError> {
    let read = |e: sqlx::Error| StartError::new(format!("reading the migration histories: {e}"));
    let before = Schema::read(&opened.db, libraries).await.map_err(read)?;
    let pool = DB::migration_pool(opened).await?;
    for library in libraries {
        if let Err(error) = library.migrator.run(&pool).await {
            DB::done_migrating(pool).await;
            return Err(migration_error(library.name, &error));
        }
    }
    DB::done_migrating(pool).await;
    let after = Schema::read(&opened.db, libraries).await.map_err(read)?;
    Ok(Migrated { before, after })
}

/// One line for a failed migration: the database's own message, and what to do about the
/// usual cause.
fn migration_error(library: &str, error: &MigrateError) -> StartError {
    let database = match error {
        MigrateError::Execute(sqlx::Error::Database(e))
        | MigrateError::ExecuteMigration(sqlx::Error::Database(e), _) => Some(e),
        _ => None,
    };
    StartError::new(match database {
        // insufficient_privilege
        Some(e) if e.code().as_deref() == Some("42501") => format!(
            "the {library} migrations need a role that may create tables ({}): run `oncely migrate` as the schema's owner; serving needs only SELECT, INSERT, UPDATE, DELETE",
            e.message()
        ),
        Some(e) => format!("the {library} migrations failed: {}", e.message()),
        None => format!("the {library} migrations failed: {error}"),
    })
}
