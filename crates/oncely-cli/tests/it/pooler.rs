//! The production topology (issue 37): behind a real PgBouncer (Debian's, installed by
//! `scripts/test`) in transaction and session mode, connections counted, a read-only server
//! answered 503 and its connections discarded, several hosts with `target_session_attrs`.

use std::process::Stdio;
use std::str::FromStr;
use std::time::{Duration, Instant};

use oncely_server::backend::{Backend, COMMAND_POOL, Location, Pooler, Postgres};
use serde_json::{Value, json};
use sqlx::postgres::PgConnectOptions;

use crate::requests::{idempotent_post, smtp_inbox};
use crate::support::{count, execute, spawn_binary, spawn_worker_with};

/// A PgBouncer of the test's own in front of the test's database: `tx` in transaction mode,
/// `sess` in session mode, and one entry named like the database itself whose sessions are
/// read-only (a standby's stand-in). Three server connections for the transaction pool, so
/// that clients share them (a session pool needs one per client connection). Stopped when
/// dropped.
pub(crate) struct Bouncer {
    child: tokio::process::Child,
    port: u16,
    database: String,
    _dir: tempfile::TempDir,
}

impl Bouncer {
    /// `None` (and a SKIPPED line) where PgBouncer is not installed.
    async fn start(url: &str) -> Option<Self> {
        Self::start_with(url, true).await
    }

    /// [`Bouncer::start`], the entry named like the database read-only or not.
    async fn start_with(url: &str, read_only: bool) -> Option<Self> {
        let Some(binary) = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
        else {
            eprintln!("SKIPPED: pgbouncer is not installed (apt-get install pgbouncer)");
            return None;
        };
        let options = PgConnectOptions::from_str(url).unwrap();
        let (host, port) = (options.get_host().to_owned(), options.get_port());
        let user = options.get_username().to_owned();
        let database = options.get_database().unwrap().to_owned();
        let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listen_port = listen.local_addr().unwrap().port();
        drop(listen);
        let dir = tempfile::tempdir().unwrap();
        let server = format!("host={host} port={port} dbname={database} user={user}");
        let named = match read_only {
            // A role whose sessions in this database are read-only (what PgBouncer's reset
            // between clients, DISCARD ALL, keeps).
            true => {
                execute(
                    url,
                    "DO $$ BEGIN CREATE ROLE oncely_test_read_only LOGIN;
                     EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
                )
                .await;
                execute(
                    url,
                    &format!(
                        "ALTER ROLE oncely_test_read_only IN DATABASE {database} \
                         SET default_transaction_read_only = on"
                    ),
                )
                .await;
                format!(
                    "host={host} port={port} dbname={database} user=oncely_test_read_only \
                     pool_mode=session pool_size=40"
                )
            }
            false => format!("{server} pool_mode=session pool_size=40"),
        };
        let ini = format!(
            "[databases]\n\
             tx = {server} pool_mode=transaction\n\
             sess = {server} pool_mode=session pool_size=40\n\
             {database} = {named}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {listen_port}\n\
             unix_socket_dir =\n\
             auth_type = any\n\
             default_pool_size = 3\n\
             max_client_conn = 500\n\
             logfile = {log}\n",
            log = dir.path().join("pgbouncer.log").display()
        );
        let config = dir.path().join("pgbouncer.ini");
        std::fs::write(&config, ini).unwrap();
        // PgBouncer refuses to run as root: as postgres then, in a directory it owns.
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        // Set the user on the child itself (no `runuser`, which would fork: killing it on
        // drop left PgBouncer running).
        let mut command = tokio::process::Command::new(binary);
        if root {
            let id = |flag: &str| -> u32 {
                let out = std::process::Command::new("id")
                    .args([flag, "postgres"])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
            };
            let (uid, gid) = (id("-u"), id("-g"));
            for path in [dir.path().to_path_buf(), config.clone()] {
                std::os::unix::fs::chown(&path, Some(uid), None).unwrap();
            }
            command.uid(uid).gid(gid);
        }
        let child = command
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", listen_port))
            .await
            .is_err()
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "PgBouncer did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some(Self {
            child,
            port: listen_port,
            database,
            _dir: dir,
        })
    }

    pub(crate) fn url(&self, alias: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{alias}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

/// A fresh database, migrated, with a [`Bouncer`] in front (`None` without PgBouncer).
pub(crate) async fn migrated_behind_a_bouncer() -> Option<(String, oncely_testdb::TestDb, Bouncer)>
{
    let (url, db) = crate::support::postgres_db().await;
    let bouncer = Bouncer::start(&url).await?;
    crate::support::migrate(&url).await;
    Some((url, db, bouncer))
}

async fn select_one(backend: &Postgres) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT 1").fetch_one(backend.db()).await
}

fn signup(email: &str) -> Value {
    json!({ "email": email, "password": "correct horse battery" })
}

/// 10 addresses, each signed up 3 times at once under one key: 10 accounts, 10 emails.
async fn retried_signups(base: &str, inbox: &oncely_inbox::Inbox, tag: &str) {
    let client = oncely_testdb::http();
    let mut requests = Vec::new();
    for i in 0..10 {
        for _ in 0..3 {
            let (client, base) = (client.clone(), base.to_owned());
            let email = format!("{tag}{i}@example.com");
            requests.push(tokio::spawn(async move {
                // A 503 (a moment without a server connection) is retried as a client would.
                for _ in 0..20 {
                    let response = idempotent_post(&client, &base, "/v1/signup", &email)
                        .json(&signup(&email))
                        .send()
                        .await
                        .unwrap();
                    match response.status().as_u16() {
                        202 => return,
                        409 | 503 => tokio::time::sleep(Duration::from_millis(50)).await,
                        other => panic!("{other}: {}", response.text().await.unwrap()),
                    }
                }
                panic!("no 202 for {email}");
            }));
        }
    }
    for request in requests {
        request.await.unwrap();
    }
    for i in 0..10 {
        let email = format!("{tag}{i}@example.com");
        assert_eq!(
            inbox
                .wait_for(&email, 1, Duration::from_secs(15))
                .await
                .len(),
            1
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..10 {
        let email = format!("{tag}{i}@example.com");
        assert_eq!(
            inbox.messages(Some(&email)).len(),
            1,
            "one email to {email}"
        );
    }
}

async fn oncely(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap()
}

/// `serve`, `worker` and `migrate` through PgBouncer in transaction mode (its defaults: no
/// `ignore_startup_parameters`), the worker listening over the direct URL (here PgBouncer's
/// session-mode entry): retried signups make one account and one email each; nothing
/// prepared collides; without the direct URL migrations are refused in one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_worker_and_migrations_run_through_pgbouncer_in_transaction_mode() {
    // Empty: the migrations run through PgBouncer.
    let (url, _db) = crate::support::empty_postgres_db().await;
    let Some(bouncer) = Bouncer::start(&url).await else {
        return;
    };
    let (tx, sess) = (bouncer.url("tx"), bouncer.url("sess"));
    let refused = oncely(&[
        "migrate",
        "--database-url",
        &tx,
        "--database-pooler",
        "transaction",
    ])
    .await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("ONCELY_DATABASE_DIRECT_URL"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    // Review: the pooler's URL as the direct one sent the migrations' advisory lock through
    // it (held for ever by a server connection nobody owns).
    let migrate_through = |direct: &str| {
        let args = [
            "migrate",
            "--database-url",
            &tx,
            "--database-pooler",
            "transaction",
            "--database-direct-url",
            direct,
        ]
        .map(str::to_owned);
        async move { oncely(&args.each_ref().map(String::as_str)).await }
    };
    let same = migrate_through(&tx).await;
    let stderr = String::from_utf8_lossy(&same.stderr);
    assert!(!same.status.success());
    assert!(
        stderr.contains("ONCELY_DATABASE_DIRECT_URL is DATABASE_URL"),
        "{stderr}"
    );
    let migrated = migrate_through(&sess).await;
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );

    let (inbox, mailer) = smtp_inbox().await;
    let through = [
        "--database-pooler",
        "transaction",
        "--database-direct-url",
        sess.as_str(),
    ];
    let mut serve_args = vec!["--workers", "0", "--database-pool", "6"];
    serve_args.extend(through);
    let api = spawn_binary(&tx, &mailer, &serve_args, &[]).await;
    let _worker = spawn_worker_with(&tx, &mailer, &through).await;
    retried_signups(&api.base, &inbox, "tx").await;
    // The worker heard of the jobs by LISTEN, over the direct URL.
    assert_eq!(
        count(
            &url,
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = 'oncely-outbox-listener' AND datname = current_database()"
        )
        .await,
        1
    );
    let log = bouncer.log();
    assert!(!log.contains("unsupported startup parameter"), "{log}");
    let mut api = api;
    api.child.kill().await.unwrap();
    let logs = api.stderr.await.unwrap();
    assert!(!logs.contains("prepared statement"), "{logs}");
}

/// Through the transaction pooler, in-process: many statements at once on 3 shared server
/// connections, named and parameterized, single and in transactions — none collides with
/// another's prepared statement; the request pool's lock timeout and the worker's hold in each
/// transaction (no pooler can drop them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statements_through_a_transaction_pooler_keep_their_settings_and_never_collide() {
    let Some((_url, _db, bouncer)) = migrated_behind_a_bouncer().await else {
        return;
    };
    let at = Location {
        url: bouncer.url("tx"),
        direct_url: Some(bouncer.url("sess")),
        pooler: Pooler::Transaction,
    };
    let backend = Postgres::connect(&at, 8).await.unwrap();
    let show = "SHOW lock_timeout";
    let pooled: String = sqlx::query_scalar(show)
        .fetch_one(backend.db())
        .await
        .unwrap();
    assert_eq!(pooled, "1500ms");
    let jobs = backend.jobs(false);
    let working: String = sqlx::query_scalar(show).fetch_one(jobs.db()).await.unwrap();
    assert_eq!(working, "0");
    let mut tasks = Vec::new();
    for i in 0..40_i64 {
        let backend = backend.clone();
        tasks.push(tokio::spawn(async move {
            for j in 0..10_i64 {
                let single: i64 = sqlx::query_scalar("SELECT $1::int8 * 2")
                    .bind(i * 100 + j)
                    .fetch_one(backend.db())
                    .await
                    .unwrap();
                assert_eq!(single, (i * 100 + j) * 2);
                let mut tx = backend.db().begin().await.unwrap();
                let a: String = sqlx::query_scalar("SELECT $1::text || 'a'")
                    .bind(i.to_string())
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                let b: i64 = sqlx::query_scalar("SELECT $1::int8 + 1")
                    .bind(j)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                assert_eq!((a, b), (format!("{i}a"), j + 1));
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Session mode needs nothing but `ONCELY_DATABASE_POOLER=session` (or nothing): settings are
/// set after connecting, so PgBouncer keeps them (the lock timeout was silently 0 when it was a
/// startup parameter PgBouncer ignored).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_runs_through_pgbouncer_in_session_mode_with_its_settings() {
    // Empty: the migrations run through PgBouncer.
    let (url, _db) = crate::support::empty_postgres_db().await;
    let Some(bouncer) = Bouncer::start(&url).await else {
        return;
    };
    let sess = bouncer.url("sess");
    let migrated = oncely(&["migrate", "--database-url", &sess]).await;
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let at = Location {
        url: sess.clone(),
        direct_url: None,
        pooler: Pooler::Session,
    };
    let backend = Postgres::connect(&at, COMMAND_POOL).await.unwrap();
    let pooled: String = sqlx::query_scalar("SHOW lock_timeout")
        .fetch_one(backend.db())
        .await
        .unwrap();
    assert_eq!(pooled, "1500ms");
    let (inbox, mailer) = smtp_inbox().await;
    let api = spawn_binary(&sess, &mailer, &["--database-pooler", "session"], &[]).await;
    retried_signups(&api.base, &inbox, "sess").await;
}

/// One process's connections: at most `ONCELY_DATABASE_POOL` in its pool, plus the listener —
/// under a storm of signups, with the workers in the same process.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_opens_its_pool_plus_the_listener_and_never_more() {
    let (url, _db) = crate::support::postgres_db().await;
    crate::support::migrate(&url).await;
    let (inbox, mailer) = smtp_inbox().await;
    let api = spawn_binary(&url, &mailer, &["--database-pool", "4"], &[]).await;
    let database = PgConnectOptions::from_str(&url)
        .unwrap()
        .get_database()
        .unwrap()
        .to_owned();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (url, stop) = (url.clone(), stop.clone());
        tokio::spawn(async move {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            let (mut pool_peak, mut other_peak) = (0_i64, 0_i64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (pool, other): (i64, i64) = sqlx::query_as(
                    "SELECT count(*) FILTER (WHERE application_name = ''),
                            count(*) FILTER (WHERE application_name <> '')
                     FROM pg_stat_activity
                     WHERE datname = $1 AND pid <> pg_backend_pid()",
                )
                .bind(&database)
                .fetch_one(&mut conn)
                .await
                .unwrap();
                pool_peak = pool_peak.max(pool);
                other_peak = other_peak.max(other);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (pool_peak, other_peak)
        })
    };
    retried_signups(&api.base, &inbox, "count").await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (pool, other) = sampler.await.unwrap();
    assert!(pool >= 2, "the storm used the pool ({pool})");
    assert!(
        pool <= 4,
        "{pool} pool connections for ONCELY_DATABASE_POOL=4"
    );
    assert!(other <= 1, "{other} others: the listener alone");
}

/// A server that turns read-only (a demoted primary; here the database's sessions made
/// read-only): a write is a 503 `storage-unavailable` with Retry-After, and once the server
/// takes writes again the connections made before are gone — the next request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_only_server_is_a_503_and_its_connections_are_discarded() {
    let (url, _db) = crate::support::postgres_db().await;
    crate::support::migrate(&url).await;
    let (_inbox, mailer) = smtp_inbox().await;
    let api = spawn_binary(&url, &mailer, &[], &[]).await;
    let client = oncely_testdb::http();
    let post =
        |email: &str| idempotent_post(&client, &api.base, "/v1/signup", email).json(&signup(email));
    assert_eq!(
        post("before@example.com").send().await.unwrap().status(),
        202
    );
    // Done from the maintenance database: the test's own becomes read-only.
    let options = PgConnectOptions::from_str(&url).unwrap();
    let name = options.get_database().unwrap().to_owned();
    let maintenance = format!(
        "postgres://{}@{}:{}/postgres",
        options.get_username(),
        options.get_host(),
        options.get_port()
    );
    execute(
        &maintenance,
        &format!("ALTER DATABASE {name} SET default_transaction_read_only = on"),
    )
    .await;
    // Every session of the process starts again, now read-only.
    execute(
        &maintenance,
        &format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"),
    )
    .await;
    let mut read_only_seen = 0;
    for _ in 0..10 {
        let response = post("during@example.com").send().await.unwrap();
        assert_eq!(response.status(), 503);
        assert!(response.headers().contains_key("retry-after"));
        let body: Value = response.json().await.unwrap();
        assert!(
            body["type"]
                .as_str()
                .unwrap()
                .ends_with("storage-unavailable"),
            "{body}"
        );
        read_only_seen += 1;
    }
    assert_eq!(read_only_seen, 10);
    execute(
        &maintenance,
        &format!("ALTER DATABASE {name} RESET default_transaction_read_only"),
    )
    .await;
    let response = post("during@example.com").send().await.unwrap();
    assert_eq!(response.status(), 202, "{}", response.text().await.unwrap());
}

/// `DATABASE_URL` with several hosts and `target_session_attrs=read-write`: a refused host and
/// a read-only one are passed over; when the host in use goes away, the pool follows to the
/// next that fits — no proxy in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_hosts_pass_over_refused_and_read_only_ones_and_follow_a_loss() {
    let Some((url, _db, bouncer)) = migrated_behind_a_bouncer().await else {
        return;
    };
    let real = PgConnectOptions::from_str(&url).unwrap();
    let database = bouncer.database.clone();
    let real_host = format!("{}:{}", real.get_host(), real.get_port());
    let read_only = format!("127.0.0.1:{}", bouncer.port);
    // Nothing listens on port 1; PgBouncer's entry named like the database is read-only.
    let hosts = format!("postgres://postgres@127.0.0.1:1,{read_only},{real_host}/{database}");
    let any = Postgres::connect(&Location::url(hosts.clone()), COMMAND_POOL)
        .await
        .unwrap();
    let mode: String = sqlx::query_scalar("SHOW transaction_read_only")
        .fetch_one(any.db())
        .await
        .unwrap();
    drop(any);
    assert_eq!(
        mode, "on",
        "target_session_attrs=any takes the first host that answers"
    );
    let writable = format!("{hosts}?target_session_attrs=read-write");
    let (inbox, mailer) = smtp_inbox().await;
    let api = spawn_binary(&writable, &mailer, &[], &[]).await;
    retried_signups(&api.base, &inbox, "hosts").await;

    // Review: with a read-only host listed before the one in use, a loss set the follower
    // probing (and discarding the pool) without end — hundreds of sessions a second.
    let pinned = Postgres::connect(&Location::url(writable.clone()), COMMAND_POOL)
        .await
        .unwrap();
    assert_eq!(select_one(&pinned).await.unwrap(), 1);
    execute(&url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()").await;
    let _ = select_one(&pinned).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sessions = "SELECT sessions FROM pg_stat_database WHERE datname = current_database()";
    let before = count(&url, sessions).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = count(&url, sessions).await - before;
    assert!(
        during < 50,
        "{during} new sessions in 2 s after one loss: the follower spins"
    );
    assert_eq!(select_one(&pinned).await.unwrap(), 1);

    // Following a loss: the host in use is a PgBouncer (session mode) in front of the real
    // server; it goes away, and the pool follows to the real server by itself.
    let mut front = Bouncer::start_with(&url, false).await.unwrap();
    let hosts = format!(
        "postgres://postgres@127.0.0.1:{},{real_host}/{database}?target_session_attrs=read-write",
        front.port
    );
    let backend = Postgres::connect(&Location::url(hosts), COMMAND_POOL)
        .await
        .unwrap();
    assert_eq!(select_one(&backend).await.unwrap(), 1);
    front.child.kill().await.unwrap();
    let _ = front.child.wait().await;
    let started = Instant::now();
    loop {
        match select_one(&backend).await {
            Ok(1) => break,
            other => {
                assert!(
                    started.elapsed() < Duration::from_secs(15),
                    "the pool did not follow to the next host: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
