//! PostgreSQL: production. Times come from the database clock (`now()`), so that many API and
//! worker processes on many machines agree on when a token expires.

use std::time::Duration;

use anyhow::bail;
use oncely::store::postgres::PgKeyStore;
use oncely_outbox::store::postgres::PgJobStore;
use oncely_sql::postgres::{OpenError, Target, first_fitting, open};
use oncely_sql::{Pooling, Settings};
use sqlx::Connection;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnection, PgQueryResult};
use time::OffsetDateTime;

use super::{Backend, Create, DevInboxHold, Location, Pooler, Stores, redact};

/// The PostgreSQL backend.
#[derive(Debug, Clone)]
pub struct Postgres {
    stores: Stores<PgKeyStore>,
    /// `DATABASE_URL` and the rest of where the database is.
    location: Location,
    /// `ONCELY_DATABASE_DIRECT_URL`, read.
    direct: Option<Target>,
    /// Where the workers' listener connects behind a transaction-mode pooler: a pool on
    /// `direct` that opens no connection itself (the listener reads where it points, which
    /// follows the primary among its hosts).
    listen: Option<sqlx::PgPool>,
}

impl Backend for Postgres {
    const NAME: &'static str = "postgres";
    type Database = sqlx::Postgres;
    // `None` binds NULL, and the statements read `COALESCE($n, now())`: the database clock.
    type Instant = Option<OffsetDateTime>;
    const BEGIN_WRITE: &'static str = "BEGIN";
    type Keys = PgKeyStore;
    type Jobs = PgJobStore;
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

    async fn open(at: &Location, max_connections: u32, _create: Create) -> anyhow::Result<Self> {
        let target = Target::parse(&at.url)
            .map_err(|e| anyhow::anyhow!("DATABASE_URL={}: {e}", redact(&at.url)))?;
        let direct =
            match &at.direct_url {
                Some(url) => Some(Target::parse(url).map_err(|e| {
                    anyhow::anyhow!("ONCELY_DATABASE_DIRECT_URL={}: {e}", redact(url))
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
            bail!(
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
        Ok(Self {
            stores: Stores::new(db, PgKeyStore::on),
            location: at.clone(),
            direct,
            listen,
        })
    }

    async fn migration_pool(&self) -> anyhow::Result<sqlx::PgPool> {
        let (name, url, target) = self.session_target("migrations")?;
        let waiting = Settings::new()
            .set("client_min_messages", "warning")
            .set("lock_timeout", "0");
        let db = open(&target, Pooling::Direct, waiting, 1, CONNECT_TIMEOUT)
            .await
            .map_err(|e| connect_error(name, url, &e))?;
        Ok(db.pool().clone())
    }

    async fn done_migrating(pool: sqlx::PgPool) {
        pool.close().await;
    }

    fn has_table(table: &str) -> String {
        format!("SELECT CASE WHEN to_regclass('{table}') IS NULL THEN 0 ELSE 1 END::int8")
    }

    async fn hold_dev_inbox(&self, description: &str) -> anyhow::Result<DevInboxHold> {
        // A session of its own holds the lock: PostgreSQL releases it when the session ends,
        // a crash included. Its application_name tells the next process who serves the inbox.
        let (name, url, target) = self.session_target("the dev inbox's lock")?;
        let options = first_fitting(&target, CONNECT_TIMEOUT)
            .await
            .map_err(|e| connect_error(name, url, &e))?
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
        // on the request's connection, inside its transaction.) On the one pool, with a lock
        // timeout of its own: each of its statements runs in a transaction that sets it.
        let jobs = PgJobStore::on(
            self.db()
                .with_local(Settings::new().set("lock_timeout", "0")),
        );
        // LISTEN needs a session: straight to the server behind a transaction-mode pooler;
        // without a URL for it the store polls by itself (and says so when a worker runs).
        let jobs = match &self.listen {
            Some(pool) => jobs.listen_through(pool.clone()),
            None => jobs,
        };
        if poll_only { jobs.poll_only() } else { jobs }
    }

    fn at(at: Option<OffsetDateTime>) -> Option<OffsetDateTime> {
        at
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }
}

impl Postgres {
    /// Where `what` (which needs one server session) connects: `ONCELY_DATABASE_DIRECT_URL`,
    /// or `DATABASE_URL` when no pooler in transaction mode stands in between (then the
    /// setting's name, its URL and its target).
    fn session_target(&self, what: &str) -> anyhow::Result<(&'static str, &str, Target)> {
        match (&self.direct, &self.location.direct_url) {
            (Some(direct), Some(url)) => Ok(("ONCELY_DATABASE_DIRECT_URL", url, direct.clone())),
            _ if self.db().pooling() == Pooling::Transaction => bail!(
                "ONCELY_DATABASE_POOLER=transaction: {what} cannot go through a pooler in \
                 transaction mode (it keeps no server session); set ONCELY_DATABASE_DIRECT_URL \
                 to a URL straight to the server (or to the pooler's session mode)"
            ),
            _ => Ok((
                "DATABASE_URL",
                &self.location.url,
                Target::parse(&self.location.url).map_err(|e| anyhow::anyhow!("{e}"))?,
            )),
        }
    }
}

/// [`super::cannot_serve_now`] for an error PostgreSQL returned.
pub(super) fn cannot_serve_now(error: &dyn sqlx::error::DatabaseError) -> bool {
    // SQLSTATE classes 08 (connection exception), 53 (insufficient resources: too many
    // connections, disk full) and 57P (the server is shutting down or restarting); 55P03
    // (lock_not_available: the request's lock_timeout ran out while another transaction held
    // a row it needs, e.g. a concurrent signup of the same address); 40P01 (deadlock_detected:
    // two transactions waited on each other, as a verification and a resend of one account
    // can, and PostgreSQL ended this one), 40001 (serialization_failure) and 25006
    // (read_only_sql_transaction: the server is a standby now, after a failover or a
    // switchover; the connections to it are discarded, see `oncely_sql::notice`). Each rolled
    // the transaction back; the same request run again succeeds.
    error.code().is_some_and(|code| {
        [
            "08",
            "53",
            "57P",
            "55P03",
            "40P01",
            "40001",
            oncely_sql::READ_ONLY,
        ]
        .iter()
        .any(|c| code.starts_with(c))
    })
}

/// How long a statement of the pool waits for a lock another transaction holds before it fails
/// (55P03: 503 `storage-unavailable`, retry later), as the idempotency layer's transactions do
/// (their own `SET LOCAL lock_timeout`): statements outside them — a password attempt counted,
/// a login's transaction, a tenant's lookup — would otherwise wait as long
/// as the lock is held, each holding one of the pool's connections. Migrations
/// ([`Backend::migration_pool`]: a session of their own) and the outbox worker's statements
/// ([`Backend::jobs`]: a record of a sent email must not give up, or the email is sent again;
/// `SET LOCAL` in each of its transactions) wait as long as it takes.
const LOCK_TIMEOUT: &str = "1500ms";

/// How long connecting (and, once serving, waiting for a free connection) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The advisory lock (two `int4` keys: "once", "devi") whose session serves the dev inbox.
const DEV_INBOX_LOCK: (i32, i32) = (0x6f6e_6365, 0x6465_7669);

/// The start of the application_name of the session that holds [`DEV_INBOX_LOCK`].
const DEV_INBOX_APPLICATION: &str = "oncely-dev-inbox";

/// One line for a failed first connection: what the server (or the network) said, where.
fn connect_error(name: &str, url: &str, failed: &OpenError) -> anyhow::Error {
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
    anyhow::anyhow!("{name}={}: {why}", redact(url))
}
