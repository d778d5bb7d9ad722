//! PostgreSQL: the pool's options ([`pool_options`]), a `DATABASE_URL` with several hosts and
//! libpq's `target_session_attrs` ([`Target`]), and a pool that follows the primary among them
//! ([`open`]).
//!
//! sqlx (0.9) takes one host per connection and no `target_session_attrs`. Like libpq, a
//! [`Target`] tries its hosts in order and takes the first whose session is what was asked for
//! (`read-write`: not read-only; `primary`: not in recovery) — checked after connecting, by every
//! new connection of the pool. While serving, a lost server or a read-only answer wakes a
//! follower ([`super::notice`]), which finds the host that now fits and points the pool at it;
//! the connections made before a read-only answer are discarded as they come back. So a
//! promotion is followed without a proxy: requests in between fail (503, retried by clients
//! with the same key), none is served by a standby.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection, PgPool, Postgres, Row};

use super::{Db, Pooling, Settings, made_before_stale, noticed};

/// Pool options for the pool of any of oncely's PostgreSQL stores: sqlx's defaults with no ping
/// before every acquire. By default sqlx pings each connection it hands out — one more round
/// trip per acquire, so per request (measured in `bench/run`'s generic-layer scenario: about
/// 18 % fewer requests per second with it). These options ping only a connection that sat idle
/// for over a second (the one most likely to have been closed by the server or a proxy); a
/// connection that dies under load fails its statement, and the request is retried with the
/// same key. A connection made before a read-only answer ([`super::notice`]) is discarded
/// instead of handed out or taken back. Set the size and timeouts on the result as usual.
pub fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if made_before_stale(meta.age) {
                    return Ok(false);
                }
                if meta.idle_for > IDLE_BEFORE_PING {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .after_release(|_, meta| Box::pin(async move { Ok(!made_before_stale(meta.age)) }))
}

/// How long a pooled connection may sit idle before [`pool_options`] pings it when handing it
/// out.
pub const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

/// What a session must be to be used (libpq's `target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionAttrs {
    /// Any server that accepts the connection.
    #[default]
    Any,
    /// One whose transactions are not read-only by default.
    ReadWrite,
    /// One that is not in recovery (not a standby).
    Primary,
}

impl SessionAttrs {
    /// As the URL spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::Primary => "primary",
        }
    }
}

/// Where the database is: one or more hosts (tried in order), and what a session there must be.
#[derive(Debug, Clone)]
pub struct Target {
    /// The options for each host, in the URL's order.
    pub hosts: Vec<PgConnectOptions>,
    /// `target_session_attrs`.
    pub attrs: SessionAttrs,
}

/// The URL parameters sqlx understands (anything else is refused rather than ignored).
const KNOWN: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

impl Target {
    /// Reads a `postgres://` URL whose authority may list several hosts
    /// (`user@h1:5432,h2:5432/db`) and whose parameters may include `target_session_attrs`
    /// (`any`, `read-write` or `primary`). The error is one line without the URL (it may hold a
    /// password).
    pub fn parse(url: &str) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .filter(|(s, _)| matches!(*s, "postgres" | "postgresql"))
            .ok_or("not a postgres:// URL")?;
        let (before_query, query) = match rest.split_once('?') {
            Some((before, query)) => (before, query),
            None => (rest, ""),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => before_query.split_at(i),
            None => (before_query, ""),
        };
        let (userinfo, hostlist) = match authority.rfind('@') {
            Some(i) => (&authority[..=i], &authority[i + 1..]),
            None => ("", authority),
        };
        let mut attrs = SessionAttrs::Any;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if key == "target_session_attrs" {
                attrs = match value {
                    "any" => SessionAttrs::Any,
                    "read-write" => SessionAttrs::ReadWrite,
                    "primary" => SessionAttrs::Primary,
                    other => {
                        return Err(format!(
                            "target_session_attrs={other} is not one oncely can write through \
                             (any, read-write or primary)"
                        ));
                    }
                };
            } else if KNOWN.contains(&key) || key.starts_with("options[") {
                kept.push(pair);
            } else {
                return Err(format!(
                    "unknown parameter `{key}` (known: target_session_attrs, {})",
                    KNOWN.join(", ")
                ));
            }
        }
        let query = if kept.is_empty() {
            String::new()
        } else {
            format!("?{}", kept.join("&"))
        };
        let hosts: Vec<&str> = hostlist.split(',').collect();
        if hosts.len() > 1 && hosts.iter().any(|h| h.is_empty()) {
            return Err("an empty host in the host list".to_owned());
        }
        let hosts = hosts
            .into_iter()
            .map(|host| {
                let one = format!("{scheme}://{userinfo}{host}{path}{query}");
                PgConnectOptions::from_str(&one)
                    .map(|options| options.extra_float_digits(None))
                    .map_err(|e| match hostlist.contains(',') {
                        true => format!("host {host}: {e}"),
                        false => e.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { hosts, attrs })
    }

    /// `host:port` (or the socket) of host `i`.
    pub fn at(&self, i: usize) -> String {
        at(&self.hosts[i])
    }
}

/// `host:port` (or the socket directory) the options name.
pub fn at(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(socket) => format!("{}", socket.display()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// What a first connection found: where, and the error.
#[derive(Debug)]
pub struct OpenError {
    /// `host:port` of the last host tried.
    pub at: String,
    /// What it said (a standby: SQLSTATE 25006).
    pub error: sqlx::Error,
}

/// Opens a pool of at most `max` connections on the first host of `target` that fits (each
/// tried with `connect_timeout`), with `session` set on each connection as it is made — or, with
/// [`Pooling::Transaction`], in each transaction instead (and no statement cached), and follows
/// the primary if `target` has several hosts. Sends no startup parameter a pooler could refuse
/// or drop (`extra_float_digits`, `options`).
pub async fn open(
    target: &Target,
    pooling: Pooling,
    session: Settings,
    max: u32,
    connect_timeout: Duration,
) -> Result<Db<Postgres>, OpenError> {
    let hosts: Arc<[PgConnectOptions]> = target
        .hosts
        .iter()
        .map(|options| match pooling {
            Pooling::Transaction => options.clone().statement_cache_capacity(0),
            Pooling::Direct => options.clone(),
        })
        .collect();
    let setup: Arc<str> = match pooling {
        Pooling::Direct => session.statements(false).into(),
        Pooling::Transaction => "".into(),
    };
    let first = find(&hosts, target.attrs, &setup, connect_timeout).await?;
    let attrs = target.attrs;
    let on_connect = setup.clone();
    let pool = pool_options()
        .max_connections(max)
        .acquire_timeout(connect_timeout)
        .after_connect(move |conn, _| {
            let setup = on_connect.clone();
            Box::pin(async move { set_up(conn, &setup, attrs).await })
        })
        .connect_lazy_with(hosts[first].clone());
    if hosts.len() > 1 {
        tokio::spawn(follow(
            pool.clone(),
            hosts,
            attrs,
            setup,
            first,
            connect_timeout,
        ));
    }
    Ok(Db::new(pool, pooling, session))
}

/// Runs `setup` on a new connection and checks it is what `attrs` asks for.
async fn set_up(
    conn: &mut PgConnection,
    setup: &str,
    attrs: SessionAttrs,
) -> Result<(), sqlx::Error> {
    let check = match attrs {
        SessionAttrs::Any => "",
        SessionAttrs::ReadWrite | SessionAttrs::Primary => {
            "SELECT pg_is_in_recovery()::text, current_setting('transaction_read_only')"
        }
    };
    if setup.is_empty() && check.is_empty() {
        return Ok(());
    }
    // One simple query (no prepared statement: also right through a pooler).
    let rows = conn
        .fetch_all(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "{setup}{check}"
        ))))
        .await?;
    if let Some(row) = rows.last().filter(|_| !check.is_empty()) {
        let recovery: String = row.try_get(0)?;
        let read_only: String = row.try_get(1)?;
        let unfit = match attrs {
            SessionAttrs::Any => None,
            SessionAttrs::Primary => (recovery == "true").then_some("in recovery (a standby)"),
            SessionAttrs::ReadWrite => {
                (recovery == "true" || read_only == "on").then_some("read-only")
            }
        };
        if let Some(what) = unfit {
            let error = sqlx::Error::Database(Box::new(Unfit(format!(
                "the server is {what}; target_session_attrs={} wants another",
                attrs.as_str()
            ))));
            super::notice(&error);
            return Err(error);
        }
    }
    Ok(())
}

/// The options of the first host of `target` whose session fits (each tried with `timeout`),
/// for a connection of its own (a listener, an advisory lock).
pub async fn first_fitting(
    target: &Target,
    timeout: Duration,
) -> Result<PgConnectOptions, OpenError> {
    let i = find(&target.hosts, target.attrs, "", timeout).await?;
    Ok(target.hosts[i].clone())
}

/// The index of the first host that accepts a connection that fits `attrs`, or the last error.
async fn find(
    hosts: &[PgConnectOptions],
    attrs: SessionAttrs,
    setup: &str,
    timeout: Duration,
) -> Result<usize, OpenError> {
    let mut last = None;
    for (i, options) in hosts.iter().enumerate() {
        let tried = tokio::time::timeout(timeout, async {
            let mut conn = PgConnection::connect_with(options).await?;
            let fits = set_up(&mut conn, setup, attrs).await;
            let _ = conn.close().await;
            fits
        })
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} s", timeout.as_secs()),
            )))
        });
        match tried {
            Ok(()) => return Ok(i),
            Err(error) => {
                last = Some(OpenError {
                    at: at(options),
                    error,
                })
            }
        }
    }
    Err(last.expect("a target has at least one host"))
}

/// While `pool` is open: after every loss [`super::notice`] saw, finds the host that fits now
/// and points the pool at it (the connections to the old one are discarded as they come back:
/// marked stale).
async fn follow(
    pool: PgPool,
    hosts: Arc<[PgConnectOptions]>,
    attrs: SessionAttrs,
    setup: Arc<str>,
    mut current: usize,
    timeout: Duration,
) {
    let mut losses = super::losses().subscribe();
    losses.borrow_and_update();
    while losses.changed().await.is_ok() {
        if pool.is_closed() {
            return;
        }
        losses.borrow_and_update();
        loop {
            match find(&hosts, attrs, &setup, timeout).await {
                Ok(found) if found == current => break,
                Ok(found) => {
                    tracing::warn!(
                        from = %at(&hosts[current]),
                        to = %at(&hosts[found]),
                        target_session_attrs = attrs.as_str(),
                        "database: following the primary to another host"
                    );
                    pool.set_connect_options(hosts[found].clone());
                    super::mark_stale();
                    current = found;
                    break;
                }
                Err(OpenError { at, error }) => {
                    tracing::debug!(%at, %error, "database: no host fits yet");
                    if pool.is_closed() {
                        return;
                    }
                    tokio::time::sleep(FOLLOW_RETRY).await;
                }
            }
        }
    }
}

/// How soon the follower asks the hosts again while none fits.
const FOLLOW_RETRY: Duration = Duration::from_millis(250);

/// A session that is not what `target_session_attrs` asks for, as a database error with
/// SQLSTATE 25006 (read_only_sql_transaction): what a statement there would have answered.
#[derive(Debug)]
struct Unfit(String);

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unfit {}

impl sqlx::error::DatabaseError for Unfit {
    fn message(&self) -> &str {
        &self.0
    }

    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(super::READ_ONLY.into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        sqlx::error::ErrorKind::Other
    }
}

/// Runs `statement` with `noticed` errors (for code that holds a bare connection).
pub async fn execute(conn: &mut PgConnection, statement: &str) -> Result<(), sqlx::Error> {
    noticed(
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned())))
            .await
            .map(|_| ()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_hosts_and_target_session_attrs() {
        let t = Target::parse(
            "postgres://u:p%40ss@h1:5432,h2:5433/db?target_session_attrs=read-write&sslmode=disable",
        )
        .unwrap();
        assert_eq!(t.attrs, SessionAttrs::ReadWrite);
        assert_eq!(t.at(0), "h1:5432");
        assert_eq!(t.at(1), "h2:5433");
        assert_eq!(t.hosts[1].get_database(), Some("db"));
        assert_eq!(t.hosts[1].get_username(), "u");
        let one = Target::parse("postgresql://u@localhost/db").unwrap();
        assert_eq!((one.hosts.len(), one.attrs), (1, SessionAttrs::Any));
        assert_eq!(
            Target::parse("postgres://u@h/db?target_session_attrs=primary")
                .unwrap()
                .attrs,
            SessionAttrs::Primary
        );
    }

    #[test]
    fn unknown_parameters_and_attrs_are_refused_in_one_line() {
        let e = Target::parse("postgres://u:secret@h/db?pool_size=3").unwrap_err();
        assert!(e.starts_with("unknown parameter `pool_size`"), "{e}");
        assert!(!e.contains("secret") && !e.contains('\n'), "{e}");
        let e = Target::parse("postgres://u@h/db?target_session_attrs=standby").unwrap_err();
        assert!(e.contains("target_session_attrs=standby"), "{e}");
        assert!(Target::parse("mysql://u@h/db").is_err());
        assert!(Target::parse("postgres://u@h1:5432,,h2/db").is_err());
        let e = Target::parse("postgres://u@h1:5432,h2:notaport/db").unwrap_err();
        assert!(e.starts_with("host h2:notaport"), "{e}");
    }
}
