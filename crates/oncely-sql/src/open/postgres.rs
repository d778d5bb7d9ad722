//! Opening PostgreSQL: the pool every statement uses (through a pooler or not, following the
//! primary among several hosts), the sessions of their own that migrations and locks need, and
//! one line for a failed first connection.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{PgPool, Postgres};

use super::{Create, Location, Open, Opened, Pooler, StartError, redact, refuse};
use crate::postgres::{OpenError, Target, first_fitting, open};
use crate::{Db, Pooling, Settings};

/// How long a statement of the pool waits for a lock another transaction holds before it fails
/// (55P03: 503 `storage-unavailable`, retry later), as the idempotency layer's transactions do
/// (their own `SET LOCAL lock_timeout`): statements outside them — a password attempt counted,
/// a login's transaction, a tenant's lookup — would otherwise wait as long as the lock is held,
/// each holding one of the pool's connections. Migrations ([`Open::migration_pool`]: a session
/// of their own) and the outbox worker's statements (a record of a sent email must not give up,
/// or the email is sent again; `SET LOCAL` in each of its transactions) wait as long as it
/// takes.
const LOCK_TIMEOUT: &str = "1500ms";

/// How long connecting (and, once serving, waiting for a free connection) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Open for Postgres {
    const NAME: &'static str = "postgres";
    const BEGIN_WRITE: &'static str = "BEGIN";
    const PRODUCTION_WARNING: Option<&'static str> = None;
    const LOSES_ACKNOWLEDGED_COMMITS: Option<&'static str> = Some(
        "SELECT CASE WHEN current_setting('synchronous_commit') IN ('off', 'local')
                THEN 1 ELSE 0 END::int8",
    );

    fn accepts(url: &str) -> bool {
        url.starts_with("postgres://") || url.starts_with("postgresql://")
    }

    async fn open(
        at: &Location,
        max_connections: u32,
        _create: Create,
    ) -> Result<Opened<Self>, StartError> {
        let target = Target::parse(&at.url)
            .map_err(|e| StartError::new(format!("DATABASE_URL={}: {e}", redact(&at.url))))?;
        let direct = match &at.direct_url {
            Some(url) => Some(Target::parse(url).map_err(|e| {
                StartError::new(format!("ONCELY_DATABASE_DIRECT_URL={}: {e}", redact(url)))
            })?),
            None => None,
        };
        let pooling = match at.pooler {
            Pooler::Transaction => Pooling::Transaction,
            Pooler::None | Pooler::Session => Pooling::Direct,
        };
        // Review: the same URL twice sends migrations and LISTEN through the transaction
        // pooler after all (the migrations' advisory lock then stays held by a server
        // connection nobody owns, and the next migration waits for ever).
        if pooling == Pooling::Transaction && at.direct_url.as_deref() == Some(at.url.as_str()) {
            refuse!(
                "ONCELY_DATABASE_DIRECT_URL is DATABASE_URL, the pooler in transaction mode: it \
                 must reach the server without one (or through the pooler's session mode)"
            );
        }
        // Set on each connection after it is made (transaction pooling: in each transaction),
        // never as startup parameters a pooler refuses or drops. PostgreSQL's NOTICEs
        // ("relation … already exists, skipping" when a migration re-checks what exists) are no
        // news to anyone: warnings and errors only.
        let session = Settings::new()
            .set("client_min_messages", "warning")
            .set("lock_timeout", LOCK_TIMEOUT);
        // The first connection is made at once, for its error: the pool retries a refused
        // connection until its timeout and then says only "pool timed out". No ping before
        // every acquire (a round trip per request): only a connection that sat idle is pinged.
        // One that died under load fails its request (nothing committed; a retry with the same
        // key runs) and is discarded.
        let db = open(&target, pooling, session, max_connections, CONNECT_TIMEOUT)
            .await
            .map_err(|e| connect_error("DATABASE_URL", &at.url, &e))?;
        let listen = match (&direct, pooling) {
            (Some(direct), Pooling::Transaction) => Some(
                open(direct, Pooling::Direct, Settings::new(), 1, CONNECT_TIMEOUT)
                    .await
                    .map_err(|e| {
                        connect_error(
                            "ONCELY_DATABASE_DIRECT_URL",
                            at.direct_url.as_deref().unwrap_or_default(),
                            &e,
                        )
                    })?
                    .pool()
                    .clone(),
            ),
            _ => None,
        };
        Ok(Opened {
            db,
            location: at.clone(),
            direct,
            listen,
        })
    }

    async fn migration_pool(opened: &Opened<Self>) -> Result<PgPool, StartError> {
        let (name, url, target) = opened.session_target("migrations")?;
        let waiting = Settings::new()
            .set("client_min_messages", "warning")
            .set("lock_timeout", "0");
        let db = open(&target, Pooling::Direct, waiting, 1, CONNECT_TIMEOUT)
            .await
            .map_err(|e| connect_error(name, url, &e))?;
        Ok(db.pool().clone())
    }

    async fn done_migrating(pool: PgPool) {
        pool.close().await;
    }

    fn has_table(table: &str) -> String {
        format!("SELECT CASE WHEN to_regclass('{table}') IS NULL THEN 0 ELSE 1 END::int8")
    }

    async fn scalar(db: &Db<Self>, sql: String) -> Result<i64, sqlx::Error> {
        super::scalar_on(db, sql).await
    }

    async fn execute(db: &Db<Self>, sql: String) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(db).await?;
        Ok(done.rows_affected())
    }
}

impl Opened<Postgres> {
    /// Where `what` (which needs one server session) connects: `ONCELY_DATABASE_DIRECT_URL`,
    /// or `DATABASE_URL` when no pooler in transaction mode stands in between (then the
    /// setting's name, its URL and its target).
    fn session_target(&self, what: &str) -> Result<(&'static str, &str, Target), StartError> {
        match (&self.direct, &self.location.direct_url) {
            (Some(direct), Some(url)) => Ok(("ONCELY_DATABASE_DIRECT_URL", url, direct.clone())),
            _ if self.db.pooling() == Pooling::Transaction => refuse!(
                "ONCELY_DATABASE_POOLER=transaction: {what} cannot go through a pooler in \
                 transaction mode (it keeps no server session); set ONCELY_DATABASE_DIRECT_URL \
                 to a URL straight to the server (or to the pooler's session mode)"
            ),
            _ => Ok((
                "DATABASE_URL",
                &self.location.url,
                Target::parse(&self.location.url).map_err(StartError::new)?,
            )),
        }
    }

    /// The options of a session of its own for `what` (an advisory lock): on the first host of
    /// the direct URL (or `DATABASE_URL`) that fits.
    pub async fn session_options(&self, what: &str) -> Result<PgConnectOptions, StartError> {
        let (name, url, target) = self.session_target(what)?;
        first_fitting(&target, CONNECT_TIMEOUT)
            .await
            .map_err(|e| connect_error(name, url, &e))
    }
}

/// One line for a failed first connection: what the server (or the network) said, where.
fn connect_error(name: &str, url: &str, failed: &OpenError) -> StartError {
    let at = &failed.at;
    let why = match &failed.error {
        sqlx::Error::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            format!("connection refused to {at} (is PostgreSQL running there?)")
        }
        sqlx::Error::Io(e) => format!("cannot reach {at}: {e}"),
        sqlx::Error::Tls(e) => format!("TLS with {at} failed: {e}"),
        sqlx::Error::Database(e) => match e.code().as_deref() {
            // invalid_password, invalid_authorization_specification
            Some("28P01" | "28000") => format!("{at} refused the login: {}", e.message()),
            // invalid_catalog_name: the database does not exist
            Some("3D000") => format!(
                "{} on {at} (create it, e.g. `createdb`, or fix the name)",
                e.message()
            ),
            // A pooler that refuses a startup parameter (PgBouncer: "unsupported startup
            // parameter"): oncely sends none of its own; the URL's `options=` is one.
            Some("08P01") if e.message().contains("startup parameter") => format!(
                "{at}: {} (a pooler: remove `options=` from the URL, or add it to the \
                 pooler's ignore_startup_parameters)",
                e.message()
            ),
            _ => format!("{at}: {}", e.message()),
        },
        other => format!("{at}: {other}"),
    };
    StartError::new(format!("{name}={}: {why}", redact(url)))
}
