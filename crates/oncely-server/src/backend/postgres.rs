//! PostgreSQL: production. Times come from the database clock (`now()`), so that many API and
//! worker processes on many machines agree on when a token expires.

use oncely::store::postgres::PgKeyStore;
use oncely_outbox::store::postgres::PgJobStore;
use oncely_sql::Settings;
use sqlx::Connection;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnection, PgQueryResult};
use time::OffsetDateTime;

use super::{Backend, DevInboxHold, Opened, Stores};

/// The PostgreSQL backend.
#[derive(Debug, Clone)]
pub struct Postgres {
    stores: Stores<PgKeyStore>,
}

impl Backend for Postgres {
    type Database = sqlx::Postgres;
    // `None` binds NULL, and the statements read `COALESCE($n, now())`: the database clock.
    type Instant = Option<OffsetDateTime>;
    type Keys = PgKeyStore;
    type Jobs = PgJobStore;
    fn migrators() -> [Migrator; 3] {
        super::migrators!(postgres, "./migrations/postgres")
    }

    fn on(opened: Opened<sqlx::Postgres>) -> Self {
        Self {
            stores: Stores::new(opened, PgKeyStore::on),
        }
    }

    async fn hold_dev_inbox(&self, description: &str) -> anyhow::Result<DevInboxHold> {
        // A session of its own holds the lock: PostgreSQL releases it when the session ends,
        // a crash included. Its application_name tells the next process who serves the inbox.
        let options = self
            .opened()
            .session_options("the dev inbox's lock")
            .await?
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
        let jobs = match &self.opened().listen {
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

/// The advisory lock (two `int4` keys: "once", "devi") whose session serves the dev inbox.
const DEV_INBOX_LOCK: (i32, i32) = (0x6f6e_6365, 0x6465_7669);

/// The start of the application_name of the session that holds [`DEV_INBOX_LOCK`].
const DEV_INBOX_APPLICATION: &str = "oncely-dev-inbox";
