//! PostgreSQL: production. Times come from the database clock (`now()`), so that many API and
//! worker processes on many machines agree on when a token expires.

use std::str::FromStr;
use std::time::Duration;

use anyhow::bail;
use oncely::store::postgres::PgKeyStore;
use oncely_outbox::store::postgres::PgJobStore;
use sqlx::Connection;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgQueryResult};
use time::OffsetDateTime;

use super::{Backend, Create, DevInboxHold, Stores, redact};
use crate::accounts::Statements;

/// The PostgreSQL backend.
#[derive(Debug, Clone)]
pub struct Postgres {
    stores: Stores<PgKeyStore>,
    /// The same database, its sessions waiting for locks as long as it takes (no
    /// [`LOCK_TIMEOUT`]): for migrations and the outbox worker. Opened as it is used.
    waiting: sqlx::PgPool,
}

impl Backend for Postgres {
    const NAME: &'static str = "postgres";
    type Database = sqlx::Postgres;
    // `None` binds NULL, and the statements read `COALESCE($n, now())`: the database clock.
    type Instant = Option<OffsetDateTime>;
    const BEGIN_WRITE: &'static str = "BEGIN";
    type Keys = PgKeyStore;
    type Jobs = PgJobStore;
    const ACCOUNT_SQL: Statements = crate::accounts::postgres::STATEMENTS;
    const PRODUCTION_WARNING: Option<&'static str> = None;
    const LOSES_ACKNOWLEDGED_COMMITS: Option<&'static str> = Some(
        "SELECT CASE WHEN current_setting('synchronous_commit') IN ('off', 'local')
                THEN 1 ELSE 0 END::int8",
    );

    fn accepts(url: &str) -> bool {
        url.starts_with("postgres://") || url.starts_with("postgresql://")
    }

    fn migrators() -> [Migrator; 3] {
        super::migrators!(postgres, "./migrations/postgres")
    }

    async fn open(url: &str, max_connections: u32, _create: Create) -> anyhow::Result<Self> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| anyhow::anyhow!("DATABASE_URL={}: {e}", redact(url)))?
            // PostgreSQL's NOTICEs ("relation … already exists, skipping" when a migration
            // re-checks what exists) are no news to anyone: warnings and errors only.
            .options([
                ("client_min_messages", "warning"),
                ("lock_timeout", LOCK_TIMEOUT),
            ]);
        // One connection first, for its error: the pool retries a refused connection until
        // its timeout and then says only "pool timed out".
        match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
            }
            Ok(Err(error)) => return Err(connect_error(url, &options, &error)),
            Err(_) => bail!(
                "DATABASE_URL={}: no answer from {} within {} s",
                redact(url),
                server(&options),
                CONNECT_TIMEOUT.as_secs()
            ),
        }
        // No ping before every acquire (a round trip per request): only a connection that
        // sat idle is pinged. One that died under load fails its request (nothing committed; a
        // retry with the same key runs) and is discarded.
        let pool = oncely::store::postgres::pool_options()
            .max_connections(max_connections)
            // A database that stops answering fails a request in seconds, not half a minute.
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(options);
        let waiting = oncely::store::postgres::pool_options()
            .max_connections(max_connections)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(
                pool.connect_options()
                    .as_ref()
                    .clone()
                    .options([("lock_timeout", "0")]),
            );
        Ok(Self {
            stores: Stores::new(pool, PgKeyStore::new),
            waiting,
        })
    }

    fn migration_pool(&self) -> sqlx::Pool<sqlx::Postgres> {
        self.waiting.clone()
    }

    fn has_table(table: &str) -> String {
        format!("SELECT CASE WHEN to_regclass('{table}') IS NULL THEN 0 ELSE 1 END::int8")
    }

    async fn hold_dev_inbox(&self, description: &str) -> anyhow::Result<DevInboxHold> {
        // A session of its own holds the lock: PostgreSQL releases it when the session ends,
        // a crash included. Its application_name tells the next process who serves the inbox.
        let options = self
            .pool()
            .connect_options()
            .as_ref()
            .clone()
            .application_name(&format!("{DEV_INBOX_APPLICATION} {description}"));
        let mut conn = PgConnection::connect_with(&options).await?;
        let held: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
            .bind(DEV_INBOX_LOCK.0)
            .bind(DEV_INBOX_LOCK.1)
            .fetch_one(&mut conn)
            .await?;
        if held {
            return Ok(DevInboxHold::Held(Box::new(tokio::sync::Mutex::new(conn))));
        }
        let holder: Option<String> = sqlx::query_scalar(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
               AND l.classid::int8 = $1 AND l.objid::int8 = $2
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             LIMIT 1",
        )
        .bind(i64::from(DEV_INBOX_LOCK.0))
        .bind(i64::from(DEV_INBOX_LOCK.1))
        .fetch_optional(&mut conn)
        .await?;
        let _ = conn.close().await;
        Ok(DevInboxHold::Elsewhere(
            holder
                .as_deref()
                .and_then(|name| name.strip_prefix(DEV_INBOX_APPLICATION))
                .map_or_else(|| "another process".to_owned(), |d| d.trim().to_owned()),
        ))
    }

    fn stores(&self) -> &Stores<PgKeyStore> {
        &self.stores
    }

    fn jobs(&self, poll_only: bool) -> PgJobStore {
        // The worker's own statements wait for locks: a write that records a sent email and
        // gave up on a row another session holds (an operator, a migration) past the lease
        // would have the email sent again. Its claims skip locked rows anyway. (Enqueues run
        // on the request's connection, inside its transaction.)
        let jobs = PgJobStore::new(self.waiting.clone());
        if poll_only { jobs.poll_only() } else { jobs }
    }

    fn at(at: Option<OffsetDateTime>) -> Option<OffsetDateTime> {
        at
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }
}

/// [`super::cannot_serve_now`] for an error PostgreSQL returned.
pub(super) fn cannot_serve_now(error: &dyn sqlx::error::DatabaseError) -> bool {
    // SQLSTATE classes 08 (connection exception), 53 (insufficient resources: too many
    // connections, disk full) and 57P (the server is shutting down or restarting); 55P03
    // (lock_not_available: the request's lock_timeout ran out while another transaction held
    // a row it needs, e.g. a concurrent signup of the same address); 40P01 (deadlock_detected:
    // two transactions waited on each other, as a verification and a resend of one account
    // can, and PostgreSQL ended this one) and 40001 (serialization_failure). Each rolled the
    // transaction back; the same request run again succeeds.
    error.code().is_some_and(|code| {
        ["08", "53", "57P", "55P03", "40P01", "40001"]
            .iter()
            .any(|c| code.starts_with(c))
    })
}

/// How long a statement of the pool waits for a lock another transaction holds before it fails
/// (55P03: 503 `storage-unavailable`, retry later), as the idempotency layer's transactions do
/// (their own `SET LOCAL lock_timeout`): statements outside them — a password attempt counted,
/// a login's transaction, a tenant's lookup — would otherwise wait as long
/// as the lock is held, each holding one of the pool's connections. Migrations
/// ([`Backend::migration_pool`]) and the outbox worker's statements ([`Backend::jobs`]: a
/// record of a sent email must not give up, or the email is sent again) run on pools of their
/// own that wait as long as it takes.
const LOCK_TIMEOUT: &str = "1500ms";

/// How long connecting (and, once serving, waiting for a free connection) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The advisory lock (two `int4` keys: "once", "devi") whose session serves the dev inbox.
const DEV_INBOX_LOCK: (i32, i32) = (0x6f6e_6365, 0x6465_7669);

/// The start of the application_name of the session that holds [`DEV_INBOX_LOCK`].
const DEV_INBOX_APPLICATION: &str = "oncely-dev-inbox";

/// `host:port` (or the socket directory) the options name.
fn server(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(socket) => format!("{}", socket.display()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// One line for a failed first connection: what the server (or the network) said, where.
fn connect_error(url: &str, options: &PgConnectOptions, error: &sqlx::Error) -> anyhow::Error {
    let at = server(options);
    let why = match error {
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
            _ => format!("{at}: {}", e.message()),
        },
        other => format!("{at}: {other}"),
    };
    anyhow::anyhow!("DATABASE_URL={}: {why}", redact(url))
}
