//! Issue 15, item 2: migrations on purpose. `oncely migrate` applies and says what; `serve` and
//! `worker` migrate only in development; production and the operator commands check the schema
//! and refuse, in one line, one that is missing or behind — so a role that
//! may only read and write rows runs them.

use oncely_server::backend::{Backend, MIGRATION_TABLES, Postgres, Sqlite};
use oncely_testdb::{TestDb, TestPostgres};
use serde_json::json;
use sqlx::AssertSqlSafe;
use sqlx::Connection;

use crate::startup::{oncely, refusal};
use crate::support::{SECRET, both_empty_databases, execute, spawn_binary};

/// The versions of the three histories' migrations, as this binary has them, ascending.
fn versions(url: &str) -> Vec<Vec<i64>> {
    let migrators = if url.starts_with("postgres") {
        Postgres::migrators()
    } else {
        Sqlite::migrators()
    };
    migrators
        .iter()
        .map(|m| {
            let mut versions: Vec<i64> = m.iter().map(|m| m.version).collect();
            versions.sort_unstable();
            versions
        })
        .collect()
}

/// `[(migrations known, latest version)]` of the three histories.
fn known(url: &str) -> Vec<(usize, i64)> {
    versions(url)
        .iter()
        .map(|v| (v.len(), *v.last().unwrap()))
        .collect()
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What `serve` needs beyond a database and a mailer to run in production.
const PRODUCTION: [&str; 4] = [
    "--env",
    "production",
    "--public-url",
    "https://accounts.example.com",
];

/// The arguments of `serve` in production on `url` (a mailer that is never reached).
fn production(url: &str) -> Vec<&str> {
    let mut args = vec![
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--database-url",
        url,
        "--mailer",
        "smtp://127.0.0.1:9",
    ];
    args.extend(PRODUCTION);
    args
}

both_empty_databases!(
    migrate_says_what_it_applied_and_then_that_it_is_up_to_date,
    production_serves_only_the_schema_it_was_built_for,
    an_upgraded_database_keeps_its_secret_check_and_development_secret,
    a_gateway_database_holds_the_key_store_alone_and_its_commands_work,
);

/// The one value `sql` returns on `url`.
async fn scalar<T>(url: &str, sql: &str) -> T
where
    T: Send + Unpin + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    T: for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    let sql = AssertSqlSafe(sql.to_owned());
    if url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    } else {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    }
}

/// The previous release's schema: the key store at 0001, the accounts at 0011 (where the secret
/// check and the development secret were the account service's), the outbox complete.
async fn migrate_as_the_previous_release(url: &str) {
    if url.starts_with("postgres") {
        let [keys, outbox, accounts] = Postgres::migrators();
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        keys.run_to(1, &pool).await.unwrap();
        outbox.run(&pool).await.unwrap();
        accounts.run_to(11, &pool).await.unwrap();
        pool.close().await;
    } else {
        let [keys, outbox, accounts] = Sqlite::migrators();
        let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc"))
            .await
            .unwrap();
        keys.run_to(1, &pool).await.unwrap();
        outbox.run(&pool).await.unwrap();
        accounts.run_to(11, &pool).await.unwrap();
        pool.close().await;
    }
}

/// Upgrading moves the secret check and the development secret to the key store's history
/// (the gateway has no account table): the rows the previous release wrote are copied, so a
/// process with another secret is still refused and a development database keeps signing
/// with the secret it made — links already sent keep working.
async fn an_upgraded_database_keeps_its_secret_check_and_development_secret(
    url: String,
    _db: TestDb,
) {
    migrate_as_the_previous_release(&url).await;
    let theirs = oncely::store::shared_secret::SecretCheck::of(&crate::support::secret(SECRET));
    let development = "development-secret-of-the-previous-release-0123456789";
    execute(
        &url,
        &format!(
            "INSERT INTO oncely_secret_check (id, current_mac, previous_mac, retired_macs) \
             VALUES (1, '{}', NULL, '')",
            theirs.current
        ),
    )
    .await;
    execute(
        &url,
        &format!("INSERT INTO oncely_development_secret (id, secret) VALUES (1, '{development}')"),
    )
    .await;
    let other = "another-secret-0123456789-0123456789-zyxw";
    let gateway = || async {
        oncely(
            &[
                "gateway",
                "--database-url",
                &url,
                "--upstream",
                "http://127.0.0.1:9",
                "--route",
                "POST /a",
                "--secret",
                other,
            ],
            &[],
        )
        .await
    };
    // (The gateway upgraded first logs its migration before it is refused.)
    let refused_by_the_check = |output: &std::process::Output| {
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.trim().lines().last().unwrap_or_default();
        assert!(
            last.contains("ONCELY_SECRET is not the secret the other processes"),
            "{stderr}"
        );
    };
    // A gateway upgraded first migrates the key store's history alone, and adopts the rows
    // (review: on SQLite it started the check afresh, accepting another secret, and the
    // development secret changed under the links already sent).
    refused_by_the_check(&gateway().await);
    let adopted: String = scalar(
        &url,
        "SELECT secret FROM oncely_shared_development_secret WHERE id = 1",
    )
    .await;
    assert_eq!(
        adopted, development,
        "the gateway adopted the development secret"
    );
    let migrated = oncely(&["migrate", "--database-url", &url], &[]).await;
    assert!(migrated.status.success(), "{}", stdout(&migrated));
    refused_by_the_check(&gateway().await);
    // The previous release's processes read only its tables: what this release's processes
    // decide is written there too (review: an old process with another secret, or a retired
    // one, was accepted after new processes had started or rotated).
    let next = "next-secret-0123456789-0123456789-abcdefgh";
    let rotating = crate::support::spawn_gateway(
        &url,
        "http://127.0.0.1:9",
        &[
            "--route",
            "POST /a",
            "--secret-previous",
            SECRET,
            "--secret",
            next,
        ][..],
    )
    .await;
    drop(rotating);
    let ring = crate::support::secret(next).with_previous(vec![crate::support::secret(SECRET)]);
    let mirrored: String = scalar(
        &url,
        "SELECT current_mac FROM oncely_secret_check WHERE id = 1",
    )
    .await;
    assert_eq!(
        mirrored,
        oncely::store::shared_secret::SecretCheck::of(&ring).current,
        "the rotation's switch, where the previous release reads it"
    );
    let copied: String = scalar::<String>(
        &url,
        "SELECT secret FROM oncely_shared_development_secret WHERE id = 1",
    )
    .await;
    assert_eq!(copied, development);
}

/// In development the gateway migrates the key store's history alone: no outbox or account
/// table. `oncely key show` and `oncely prune` work on its database, as the gateway's docs say;
/// a command that needs the service's tables says to run `oncely migrate`.
async fn a_gateway_database_holds_the_key_store_alone_and_its_commands_work(
    url: String,
    _db: TestDb,
) {
    let gateway =
        crate::support::spawn_gateway(&url, "http://127.0.0.1:9", &["--route", "POST /a"]).await;
    drop(gateway);
    let histories = scalar::<i64>(
        &url,
        &format!("SELECT COUNT(*) FROM {} WHERE success", MIGRATION_TABLES[0]),
    )
    .await;
    assert_eq!(
        histories,
        known(&url)[0].0 as i64,
        "the key store's history, complete"
    );
    for table in &MIGRATION_TABLES[1..] {
        let exists = if url.starts_with("postgres") {
            format!("SELECT CASE WHEN to_regclass('{table}') IS NULL THEN 0 ELSE 1 END::int8")
        } else {
            format!("SELECT COUNT(*) FROM sqlite_master WHERE name = '{table}'")
        };
        assert_eq!(scalar::<i64>(&url, &exists).await, 0, "{table}");
    }
    let pruned = oncely(&["prune", "--database-url", &url, "--json"], &[]).await;
    assert!(pruned.status.success(), "{}", refusal(&pruned));
    let pruned: serde_json::Value = serde_json::from_slice(&pruned.stdout).unwrap();
    assert_eq!(pruned["total"], 0, "{pruned}");
    let shown = oncely(
        &[
            "key",
            "show",
            "k-1",
            "--database-url",
            &url,
            "--route",
            "/a",
        ],
        &[],
    )
    .await;
    assert!(
        refusal(&shown).contains("not found"),
        "the key store is read, the key is not there: {}",
        refusal(&shown)
    );
    let listed = oncely(&["tenant", "list", "--database-url", &url], &[]).await;
    assert!(
        refusal(&listed).contains("run `oncely migrate`"),
        "{}",
        refusal(&listed)
    );
}

async fn migrate_says_what_it_applied_and_then_that_it_is_up_to_date(url: String, _db: TestDb) {
    let known = known(&url);
    let first = oncely(
        &["migrate", "--database-url", &url],
        &[("RUST_LOG", "info")],
    )
    .await;
    assert!(first.status.success(), "{first:?}");
    let text = stdout(&first);
    let total: usize = known.iter().map(|(n, _)| n).sum();
    assert!(
        text.ends_with(&format!("migrations: {total} applied\n")),
        "{text}"
    );
    for ((library, (n, latest)), line) in ["idempotency keys", "outbox", "accounts"]
        .into_iter()
        .zip(&known)
        .zip(text.lines())
    {
        assert!(
            line.starts_with(library)
                && line.ends_with(&format!(" {n} applied, schema at {latest:04}")),
            "{line}"
        );
    }
    let again = oncely(
        &["migrate", "--database-url", &url],
        &[("RUST_LOG", "info")],
    )
    .await;
    assert!(again.status.success(), "{again:?}");
    let text = stdout(&again);
    assert!(text.ends_with("migrations: up to date\n"), "{text}");
    for ((_, latest), line) in known.iter().zip(text.lines()) {
        assert!(
            line.ends_with(&format!(" up to date (schema at {latest:04})")),
            "{line}"
        );
    }
    // PostgreSQL's NOTICEs ("relation \"_oncely_…_migrations\" already exists, skipping") are
    // not news.
    for output in [&first, &again] {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !stderr.contains("already exists") && !stderr.to_lowercase().contains("notice"),
            "{stderr}"
        );
    }
}

/// Every command migrated at start; production now checks, and refuses a database that is not
/// migrated or is behind the binary (one a newer release migrated is served); development
/// still migrates by itself.
async fn production_serves_only_the_schema_it_was_built_for(url: String, _db: TestDb) {
    let env = [("ONCELY_SECRET", SECRET)];
    // No SQLite file; an empty PostgreSQL database.
    let line = refusal(&oncely(&production(&url), &env).await);
    assert!(
        line.ends_with(": is DATABASE_URL right? run `oncely migrate`"),
        "{line}"
    );
    if let Some(file) = url.strip_prefix("sqlite://") {
        assert!(!std::path::Path::new(file).exists(), "no file created");
    }
    assert!(
        oncely(&["migrate", "--database-url", &url], &[])
            .await
            .status
            .success()
    );

    // Behind: the newest outbox migration is not applied (as after deploying the release that
    // added it, before `oncely migrate`).
    let [_, outbox, _] = MIGRATION_TABLES;
    let outbox_versions = &versions(&url)[1];
    let [.., previous, latest] = outbox_versions[..] else {
        unreachable!("the outbox has several migrations")
    };
    let applied =
        |yes: bool| format!("UPDATE {outbox} SET success = {yes} WHERE version = {latest}");
    execute(&url, &applied(false)).await;
    let line = refusal(&oncely(&production(&url), &env).await);
    assert_eq!(
        line,
        format!(
            "the database is not migrated to this binary (outbox at {previous:04}, this binary needs {latest:04}): run `oncely migrate`"
        )
    );
    execute(&url, &applied(true)).await;
    let started = spawn_binary(&url, "smtp://127.0.0.1:9", &PRODUCTION, &env).await;
    assert!(
        started.banner[0].starts_with("oncely API:"),
        "{:?}",
        started.banner
    );
    drop(started);

    // Ahead: a newer release migrated it.
    let newer = if url.starts_with("postgres") {
        format!(
            "INSERT INTO {outbox} (version, description, success, checksum, execution_time) VALUES (9999, 'newer', true, '\\x00'::bytea, 1)"
        )
    } else {
        format!(
            "INSERT INTO {outbox} (version, description, success, checksum, execution_time) VALUES (9999, 'newer', 1, x'00', 1)"
        )
    };
    execute(&url, &newer).await;
    // Served, with a warning: migrations only add, and during a rolling upgrade an old process
    // that restarts after `oncely migrate` must start.
    let started = spawn_binary(&url, "smtp://127.0.0.1:9", &PRODUCTION, &env).await;
    assert!(
        started.banner[0].starts_with("oncely API:"),
        "{:?}",
        started.banner
    );
    drop(started);
    // Development starts on it (and says so).
    let development = spawn_binary(&url, "smtp://127.0.0.1:9", &[], &[]).await;
    drop(development);
}

/// Issue 15, item 1: `outbox list` (and every other operator command) on a mistyped
/// `DATABASE_URL` created an empty SQLite file, migrated it, and listed nothing.
#[tokio::test]
async fn operator_commands_never_create_or_migrate_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("typo.db");
    let url = format!("sqlite://{}", file.display());
    let commands: [&[&str]; 7] = [
        &["outbox", "list"],
        &["outbox", "dead"],
        &["outbox", "show", "signup-verification:x"],
        &["outbox", "retry", "--kind", "email.verification"],
        &["key", "show", "k"],
        &["tenant", "create", "acme"],
        &["prune"],
    ];
    for command in commands {
        let args = [command, &["--database-url", &url]].concat();
        let line = refusal(&oncely(&args, &[]).await);
        assert_eq!(
            line,
            format!(
                "DATABASE_URL={url}: there is no database file {}: is DATABASE_URL right? run `oncely migrate`",
                file.display()
            ),
            "{command:?}"
        );
        assert!(!file.exists(), "{command:?} created {}", file.display());
    }
    // An empty database (an SQLite file of nobody's, a fresh PostgreSQL database): not migrated
    // behind the user's back either.
    std::fs::write(&file, b"").unwrap();
    let postgres = TestPostgres::empty().await;
    for url in [url.as_str(), postgres.url()] {
        for command in commands {
            let args = [command, &["--database-url", url]].concat();
            let line = refusal(&oncely(&args, &[]).await);
            assert!(
                line.ends_with(
                    "holds no oncely tables: is DATABASE_URL right? run `oncely migrate`"
                ) || line.ends_with(
                    "is empty, no database: is DATABASE_URL right? run `oncely migrate`"
                ),
                "{command:?}: {line}"
            );
        }
    }
    // Not even opened as a database (the review of issue 15 found it turned into a 4096-byte
    // WAL database with an -wal file beside it).
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        0,
        "the empty file untouched"
    );
    assert!(!dir.path().join("typo.db-wal").exists());
    let tables = crate::support::count(&url, "SELECT COUNT(*) FROM sqlite_master").await;
    assert_eq!(tables, 0, "nothing migrated");
    let tables = crate::support::count(
        postgres.url(),
        "SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'",
    )
    .await;
    assert_eq!(tables, 0, "nothing migrated");
}

/// A role that may only SELECT, INSERT, UPDATE and DELETE (and use sequences) could run no
/// command: every one migrated at start. Now production `serve` runs with it on a migrated
/// database, and on an unmigrated one it is told what to do.
#[tokio::test]
async fn a_least_privilege_role_serves_a_migrated_database_in_production() {
    let migrated = TestPostgres::empty().await;
    let empty = TestPostgres::empty().await;
    assert!(
        oncely(&["migrate", "--database-url", migrated.url()], &[])
            .await
            .status
            .success()
    );
    let role = format!("oncely_app_{}", uuid::Uuid::new_v4().simple());
    let password = "app-password-0123";
    let admin = oncely_testdb::server_url();
    let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN PASSWORD '{password}'"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    let _dropped_at_the_end = TestRole {
        name: role.clone(),
        databases: vec![migrated.url().to_owned(), empty.url().to_owned()],
    };
    let grant = format!(
        "GRANT USAGE ON SCHEMA public TO {role};
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role};"
    );
    for db in [&migrated, &empty] {
        let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(grant.clone()))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let as_role = |url: &str| {
        use sqlx::ConnectOptions;
        url.parse::<sqlx::postgres::PgConnectOptions>()
            .unwrap()
            .username(&role)
            .password(password)
            .to_url_lossy()
            .to_string()
    };
    let (migrated_url, empty_url) = (as_role(migrated.url()), as_role(empty.url()));

    let (inbox, running) = crate::support::start_inbox(oncely_inbox::Faults::default()).await;
    let mailer = format!("smtp://{}", running.smtp_addr);
    let env = [("ONCELY_SECRET", SECRET)];
    let mut serving = spawn_binary(&migrated_url, &mailer, &PRODUCTION, &env).await;
    let client = oncely_testdb::http();
    let ready = client
        .get(format!("{}/readyz", serving.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let signup = client
        .post(format!("{}/v1/signup", serving.base))
        .header("idempotency-key", "least-privilege")
        .json(&json!({ "email": "ada@example.com" }))
        .send()
        .await
        .unwrap();
    assert_eq!(signup.status(), 202);
    inbox
        .wait_for("ada@example.com", 1, std::time::Duration::from_secs(10))
        .await;
    assert_eq!(
        inbox.messages(Some("ada@example.com")).len(),
        1,
        "its worker mailed"
    );
    serving.child.kill().await.unwrap();
    let logs = serving.stderr.await.unwrap();
    assert!(!logs.contains("permission denied"), "{logs}");

    // Every operator command too (the review of issue 15 found `tenant …` and `prune`
    // migrating after the check: "permission denied for schema public", four times).
    let operator_commands: [&[&str]; 7] = [
        &["tenant", "create", "acme"],
        &["tenant", "list"],
        &["tenant", "rotate-key", "acme"],
        &["prune"],
        &["outbox", "list"],
        &["outbox", "dead"],
        &["key", "show", "least-privilege"],
    ];
    for command in operator_commands {
        let output = oncely(&[command, &["--database-url", &migrated_url]].concat(), &[]).await;
        assert!(
            output.status.success(),
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    let line = refusal(&oncely(&production(&empty_url), &env).await);
    assert!(
        line.ends_with("holds no oncely tables: is DATABASE_URL right? run `oncely migrate`"),
        "{line}"
    );
    let line = refusal(&oncely(&["migrate", "--database-url", &empty_url], &[]).await);
    assert!(
        line.starts_with("the idempotency keys migrations need a role that may create tables (permission denied for schema public)")
            && line.matches("permission denied").count() == 1,
        "{line}"
    );
}

/// A login role, dropped (with its privileges in `databases`) when the test ends, pass or fail.
struct TestRole {
    name: String,
    databases: Vec<String>,
}

impl Drop for TestRole {
    fn drop(&mut self) {
        let (name, databases) = (self.name.clone(), self.databases.clone());
        // Drop runs inside the test's runtime: a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                for url in &databases {
                    let mut conn = sqlx::PgConnection::connect(url).await.ok()?;
                    sqlx::raw_sql(AssertSqlSafe(format!("DROP OWNED BY {name}")))
                        .execute(&mut conn)
                        .await
                        .ok()?;
                }
                let mut conn = sqlx::PgConnection::connect(&oncely_testdb::server_url())
                    .await
                    .ok()?;
                sqlx::raw_sql(AssertSqlSafe(format!("DROP ROLE IF EXISTS {name}")))
                    .execute(&mut conn)
                    .await
                    .ok()
            })
        })
        .join();
    }
}
