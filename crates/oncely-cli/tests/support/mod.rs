//! `spawn_app`: the service on a random port with a fresh database and the test inbox.

pub mod browser;
pub mod requests;

use std::process::Stdio;
use std::time::Duration;

use oncely::ServerSecret;
use oncely_inbox::{Faults, Inbox, Message, Running};
use oncely_server::accounts::Accounts;
use oncely_server::app::Application;
use oncely_server::backend::{Postgres, Sqlite};
use oncely_server::settings::{MailerChoice, Settings};
use oncely_testdb::{Migrations, TestDb, TestPostgres, TestSqlite};
use serde_json::Value;
use sqlx::{AssertSqlSafe, Connection};
use tokio::io::{AsyncBufReadExt, BufReader};

pub const SECRET: &str = "test-secret-0123456789-0123456789-abcdef";

/// A server secret.
pub fn secret(secret: &str) -> ServerSecret {
    ServerSecret::new(secret.as_bytes().to_vec()).unwrap()
}

/// The settings of a test app: any free port, `mailer` (a URL or `dev`), retries after 10 ms,
/// the test secret; otherwise `oncely serve`'s defaults.
pub fn settings(database_url: &str, mailer: &str) -> Settings {
    let mut settings = Settings::new(database_url, secret(SECRET));
    settings.bind = ([127, 0, 0, 1], 0).into();
    settings.mailer.choice = match mailer {
        "dev" => MailerChoice::Dev,
        url => MailerChoice::Url(url.to_owned()),
    };
    settings.retry_base = Duration::from_millis(10);
    settings
}

/// The email caps as `--mail-cap-per-address` and `--mail-cap-per-client` set them (the total
/// per address: 4 × per address).
pub fn mail_caps(settings: &mut Settings, per_address: u32, per_client: u32) {
    settings.limits.per_address = per_address;
    settings.limits.per_address_total = per_address * 4;
    settings.limits.per_client = per_client;
}

/// A running app and the inbox it mails to.
pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub inbox: Inbox,
    pub database_url: String,
}

pub async fn start_inbox(faults: Faults) -> (Inbox, Running) {
    Inbox::start_local(faults).await.unwrap()
}

/// The app, in this process, mailing over SMTP to a fresh inbox; `configure` changes its
/// [`settings`].
pub async fn spawn_app_on(database_url: &str, configure: impl FnOnce(&mut Settings)) -> TestApp {
    let (inbox, running) = start_inbox(Faults::default()).await;
    spawn_app_with_inbox(database_url, inbox, running, configure).await
}

pub async fn spawn_app_with_inbox(
    database_url: &str,
    inbox: Inbox,
    running: Running,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    let mut settings = settings(database_url, &format!("smtp://{}", running.smtp_addr));
    // Over SMTP the workers reconcile unknown outcomes (the default): asking the inbox, as a
    // deployment with ONCELY_MAILER_LOOKUP does.
    settings.mailer.lookup = Some(format!("http://{}/deliveries/{{key}}", running.http_addr));
    configure(&mut settings);
    let base = if database_url.starts_with("postgres") {
        start::<Postgres>(settings).await
    } else {
        start::<Sqlite>(settings).await
    };
    TestApp {
        base,
        client: oncely_testdb::http(),
        inbox,
        database_url: database_url.to_owned(),
    }
}

/// `oncely ARGS…`, the binary under test, not yet started.
pub fn oncely_binary(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"));
    command.args(args);
    command
}

/// Runs `command` to its end: its exit code (-1: ended by a signal), stdout and stderr.
pub async fn run_to_end(command: &mut tokio::process::Command) -> (i32, String, String) {
    let output = command.output().await.unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// Runs `command` to its end and asserts that it succeeded (its stderr otherwise); its stdout.
pub async fn run_ok(command: &mut tokio::process::Command) -> String {
    let (code, stdout, stderr) = run_to_end(command).await;
    assert_eq!(code, 0, "{stderr}");
    stdout
}

/// Runs `oncely migrate` on the database (production processes do not migrate).
pub async fn migrate(database_url: &str) {
    run_ok(&mut oncely_binary(&[
        "migrate",
        "--database-url",
        database_url,
    ]))
    .await;
}

/// Starts the app on backend `B` in this process; returns its base URL.
pub async fn start<B: Accounts>(settings: Settings) -> String {
    let app = Application::<B>::build(settings)
        .await
        .expect("the app starts");
    let base = format!("http://{}", app.addr());
    tokio::spawn(app.run_until(std::future::pending()));
    base
}

impl TestApp {
    /// A POST as a tenant (`Authorization: Bearer <api_key>`).
    pub async fn post_as(
        &self,
        api_key: &str,
        path: &str,
        key: &str,
        body: &Value,
    ) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .bearer_auth(api_key)
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// The status of a POST as a tenant ([`TestApp::post_as`]).
    pub async fn status_as(&self, api_key: &str, path: &str, key: &str, body: &Value) -> u16 {
        let response = self.post_as(api_key, path, key, body).await;
        response.status().as_u16()
    }

    /// Creates a tenant with `oncely tenant create` and returns the API key it printed.
    pub async fn create_tenant(&self, name: &str) -> String {
        create_tenant(&self.database_url, name).await
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    pub async fn post(&self, path: &str, key: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// Waits for `n` emails to `to` (or 10 s), then until the outbox has settled (or 10 s), so
    /// that an extra one that would come is there too.
    pub async fn emails_to(&self, to: &str, n: usize) -> Vec<Message> {
        self.inbox.wait_for(to, n, Duration::from_secs(10)).await;
        outbox_settled(&self.database_url, Duration::from_secs(10)).await;
        self.inbox.messages(Some(to))
    }

    pub async fn count(&self, sql: &str) -> i64 {
        count(&self.database_url, sql).await
    }
}

/// Waits until no email job is being sent or due to be (none claimed, none pending whose time
/// comes within a second), or `within` has passed: every email the outbox was about to send is
/// in the inbox. (A parked job, its outcome unknown, sends nothing before its grace is over.)
pub async fn outbox_settled(database_url: &str, within: Duration) {
    let soon = if database_url.starts_with("postgres") {
        "now() + interval '1 second'"
    } else {
        // Unix milliseconds.
        "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + 1000"
    };
    let unsettled = format!(
        "SELECT count(*) FROM oncely_outbox
          WHERE kind LIKE 'email.%' AND status = 'pending'
            AND (lease_token IS NOT NULL OR run_after <= {soon})"
    );
    let deadline = std::time::Instant::now() + within;
    while count(database_url, &unsettled).await > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Creates a tenant with `oncely tenant create` and returns the API key it printed.
pub async fn create_tenant(database_url: &str, name: &str) -> String {
    let create = ["tenant", "create", name, "--database-url", database_url];
    let stdout = run_ok(&mut oncely_binary(&create)).await;
    stdout.lines().last().unwrap().trim().to_owned()
}

/// `oncely tenant set NAME --return-url URL` on the database.
pub async fn set_return_url(database_url: &str, name: &str, url: &str) {
    let set = ["tenant", "set", name, "--return-url", url];
    run_ok(oncely_binary(&set).args(["--database-url", database_url])).await;
}

pub async fn count(database_url: &str, sql: &str) -> i64 {
    scalar(database_url, sql).await
}

/// `$body`, with `$conn` a new connection to the database at `$url` (PostgreSQL or SQLite).
macro_rules! on_connection {
    ($url:expr, |$conn:ident| $body:expr) => {
        if $url.starts_with("postgres") {
            let mut $conn = sqlx::PgConnection::connect($url).await.unwrap();
            $body
        } else {
            let mut $conn = sqlx::SqliteConnection::connect($url).await.unwrap();
            $body
        }
    };
}

/// The one value `sql` selects (a count, a text, an id).
pub async fn scalar<T>(database_url: &str, sql: &str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres>
        + sqlx::Type<sqlx::Postgres>
        + for<'r> sqlx::Decode<'r, sqlx::Sqlite>
        + sqlx::Type<sqlx::Sqlite>
        + Send
        + Unpin,
{
    let sql = AssertSqlSafe(sql.to_owned());
    on_connection!(database_url, |conn| sqlx::query_scalar(sql)
        .fetch_one(&mut conn)
        .await
        .unwrap())
}

/// The id of the account `address` of `tenant`, hyphenated.
pub async fn user_id(database_url: &str, tenant: &str, address: &str) -> String {
    let id = if database_url.starts_with("postgres") {
        "id::text"
    } else {
        "lower(hex(id))"
    };
    let sql =
        format!("SELECT {id} FROM oncely_users WHERE tenant = '{tenant}' AND email = '{address}'");
    let id: String = scalar(database_url, &sql).await;
    uuid::Uuid::parse_str(&id).unwrap().to_string()
}

/// The rows `sql` selects, one text column.
pub async fn texts(database_url: &str, sql: &str) -> Vec<String> {
    let sql = AssertSqlSafe(sql.to_owned());
    on_connection!(database_url, |conn| sqlx::query_scalar(sql)
        .fetch_all(&mut conn)
        .await
        .unwrap())
}

/// Runs one statement (test set-up that the API cannot do, like ageing a token).
pub async fn execute(database_url: &str, sql: &str) {
    let sql = AssertSqlSafe(sql.to_owned());
    on_connection!(database_url, |conn| {
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    });
}

/// Every row of every table, as text (bytes as hex), for scanning a database for secrets.
pub async fn dump(database_url: &str) -> String {
    let mut out = String::new();
    if database_url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(database_url).await.unwrap();
        let tables: Vec<String> =
            sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        for table in tables {
            let rows: Vec<String> =
                sqlx::query_scalar(AssertSqlSafe(format!("SELECT t::text FROM {table} t")))
                    .fetch_all(&mut conn)
                    .await
                    .unwrap();
            out.push_str(&rows.join("\n"));
        }
    } else {
        let mut conn = sqlx::SqliteConnection::connect(database_url).await.unwrap();
        let tables: Vec<String> =
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table'")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        for table in tables {
            let columns: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT name FROM pragma_table_info('{table}')"
            )))
            .fetch_all(&mut conn)
            .await
            .unwrap();
            let text = columns
                .iter()
                .map(|c| format!("quote({c})"))
                .collect::<Vec<_>>()
                .join(" || ',' || ");
            let rows: Vec<String> =
                sqlx::query_scalar(AssertSqlSafe(format!("SELECT {text} FROM {table}")))
                    .fetch_all(&mut conn)
                    .await
                    .unwrap();
            out.push_str(&rows.join("\n"));
        }
    }
    out
}

/// An Argon2id PHC string of `password` (as a release that stored it would have).
pub fn argon2_hash(password: &str) -> String {
    use argon2::PasswordHasher;
    let salt = argon2::password_hash::SaltString::encode_b64(&[9; 16]).unwrap();
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .unwrap()
        .to_string()
}

/// The token in a verification email.
pub fn token_in(message: &Message) -> String {
    oncely_chaos::tokens_in(&message.text)
        .into_iter()
        .next()
        .expect("a link with a token")
}

/// A PostgreSQL database as `oncely migrate` leaves it: cloned from a template this binary's
/// migrations built (the first test to need it builds it).
pub async fn postgres_db() -> (String, TestDb) {
    let db = migrated_postgres().await;
    (db.url().to_owned(), TestDb::Postgres(Box::new(db)))
}

/// An empty PostgreSQL database: for the tests of migrating (a migrated one is
/// [`postgres_db`]).
pub async fn empty_postgres_db() -> (String, TestDb) {
    let db = TestPostgres::empty().await;
    (db.url().to_owned(), TestDb::Postgres(Box::new(db)))
}

/// [`postgres_db`]'s database itself.
pub async fn migrated_postgres() -> TestPostgres {
    use oncely_server::backend::{Backend, COMMAND_POOL, Location};
    let migrations = Postgres::migrators()
        .iter()
        .fold(Migrations::new("server"), Migrations::migrator);
    TestPostgres::migrated(&migrations, async |url: String| {
        let backend = Postgres::connect(&Location::url(url.as_str()), COMMAND_POOL)
            .await
            .expect("open the template");
        oncely_server::startup::migrate(&backend)
            .await
            .expect("migrate the template");
        backend.pool().close().await;
    })
    .await
}

pub async fn sqlite_db() -> (String, TestDb) {
    let db = TestSqlite::new();
    (db.url().to_owned(), TestDb::Sqlite(db))
}

/// The `oncely` binary as a child process; its stdout's first line gives the address.
pub struct Process {
    pub child: tokio::process::Child,
    pub base: String,
    pub stderr: tokio::task::JoinHandle<String>,
    /// What `serve` printed before serving: the API, the dev inbox, a `curl` to try.
    pub banner: Vec<String>,
}

/// `oncely <subcommand>` on this database and mailer, with the test secret and retries after
/// 10 ms.
fn oncely_command(subcommand: &str, database_url: &str, mailer: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"));
    command.args([
        subcommand,
        "--database-url",
        database_url,
        "--mailer",
        mailer,
        "--secret",
        SECRET,
        "--retry-base",
        "10ms",
    ]);
    command
}

/// The first line the child prints (within 30 s); the rest of its output is drained in the
/// background.
async fn first_line(child: &mut tokio::process::Child) -> String {
    lines_until(child, |_| true).await.remove(0)
}

/// The lines the child prints up to the first that `last` accepts (each within 30 s); the rest
/// of its output is drained in the background.
async fn lines_until(
    child: &mut tokio::process::Child,
    last: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut lines = Vec::new();
    loop {
        let line = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
            .await
            .unwrap()
            .unwrap()
            .expect("the process printed a line before it ended");
        let done = last(&line);
        lines.push(line);
        if done {
            break;
        }
    }
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    lines
}

pub async fn spawn_binary(
    database_url: &str,
    mailer: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Process {
    let mut command = oncely_command("serve", database_url, mailer);
    if !extra.contains(&"--bind") {
        command.args(["--bind", "127.0.0.1:0"]);
    }
    command.args(extra).env("RUST_LOG", "debug");
    for (k, v) in env {
        command.env(k, v);
    }
    // The banner ends with a `curl` to try.
    started(command, |line| line.starts_with("try:")).await
}

/// The child `command` starts, its log read from the start (a debug log written before the
/// banner fills the pipe's buffer, 64 KiB, otherwise, and the process stops in a write before
/// it prints the banner), and its banner up to the line `last` accepts; the first line names
/// the address.
async fn started(mut command: tokio::process::Command, last: impl Fn(&str) -> bool) -> Process {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("the oncely binary starts");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let stderr = tokio::spawn(async move {
        let mut all = String::new();
        let mut line = String::new();
        while stderr.read_line(&mut line).await.unwrap_or(0) > 0 {
            all.push_str(&line);
            line.clear();
        }
        all
    });
    let banner = lines_until(&mut child, last).await;
    let base = banner[0]
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("the address")
        .to_owned();
    Process {
        child,
        base,
        stderr,
        banner,
    }
}

/// `oncely gateway` in front of `upstream` as a child process, on a free port unless `extra`
/// names `--bind`, with the test secret unless it names `--secret`.
pub async fn spawn_gateway(database_url: &str, upstream: &str, extra: &[&str]) -> Process {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"));
    command.args([
        "gateway",
        "--database-url",
        database_url,
        "--upstream",
        upstream,
    ]);
    if !extra.contains(&"--secret") {
        command.args(["--secret", SECRET]);
    }
    if !extra.contains(&"--bind") {
        command.args(["--bind", "127.0.0.1:0"]);
    }
    command.args(extra);
    started(command, |line| {
        line.contains("every other request passes through")
    })
    .await
}

/// Each case on a migrated PostgreSQL database ([`postgres_db`]) and an SQLite file.
macro_rules! both_databases {
    ($($name:ident),* $(,)?) => {
        oncely_testdb::both_stores!(crate::support::postgres_db, crate::support::sqlite_db; $($name),*);
    };
}
pub(crate) use both_databases;

/// Each case on an empty PostgreSQL database ([`empty_postgres_db`]) and an SQLite file: the
/// tests of migrating.
#[allow(unused_macros)]
macro_rules! both_empty_databases {
    ($($name:ident),* $(,)?) => {
        oncely_testdb::both_stores!(crate::support::empty_postgres_db, crate::support::sqlite_db; $($name),*);
    };
}
#[allow(unused_imports)]
pub(crate) use both_empty_databases;

/// `f::<Postgres>(args…)` or `f::<Sqlite>(args…)`, as the database URL says, awaited.
#[allow(unused_macros)]
macro_rules! on_backend {
    ($url:expr, $f:ident($($arg:expr),* $(,)?)) => {
        if $url.starts_with("postgres") {
            $f::<oncely_server::backend::Postgres>($($arg),*).await
        } else {
            $f::<oncely_server::backend::Sqlite>($($arg),*).await
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_backend;

/// The backend `B` on the database at `url`, opened as a command opens it.
pub async fn open_backend<B: oncely_server::backend::Backend>(url: &str) -> B {
    let at = oncely_server::backend::Location::url(url);
    B::connect(&at, oncely_server::backend::COMMAND_POOL)
        .await
        .unwrap()
}

/// [`open_backend`], migrated by this release.
pub async fn open_migrated<B: Accounts>(url: &str) -> B {
    let backend = open_backend::<B>(url).await;
    oncely_server::startup::migrate(&backend).await.unwrap();
    backend
}

/// `oncely worker` as a child process; returns once it reports that it runs.
pub async fn spawn_worker(database_url: &str, mailer: &str) -> tokio::process::Child {
    spawn_worker_with(database_url, mailer, &[]).await
}

/// `oncely worker` with `extra` arguments (`--lease 2s`, …); returns once it reports that it
/// runs.
pub async fn spawn_worker_with(
    database_url: &str,
    mailer: &str,
    extra: &[&str],
) -> tokio::process::Child {
    let mut child = oncely_command("worker", database_url, mailer)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the oncely binary starts");
    let first = first_line(&mut child).await;
    assert!(first.starts_with("oncely worker:"), "{first}");
    child
}

/// A `Write` into a shared buffer: the log lines of a test ([`capture_logs`]).
#[derive(Clone, Default)]
pub struct Logs(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Every log line of this thread (every level, no colours) into [`Logs`], until the guard
/// drops. Callsites that other tests' threads met first (with no subscriber) are asked again.
pub fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    (logs, guard)
}

/// `oncely inbox` on free ports: the process and its HTTP base URL.
pub async fn spawn_inbox() -> (tokio::process::Child, String) {
    spawn_inbox_with(&[]).await
}

/// [`spawn_inbox`] with these flags too.
pub async fn spawn_inbox_with(args: &[&str]) -> (tokio::process::Child, String) {
    spawn_inbox_with_env(args, &[]).await
}

/// [`spawn_inbox_with`] with these environment variables too; returns once it serves (it
/// printed its addresses).
pub async fn spawn_inbox_with_env(
    args: &[&str],
    env: &[(&str, &str)],
) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["inbox", "--smtp", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut first)
        .await
        .unwrap();
    let base = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("the HTTP address")
        .to_owned();
    // Read the rest, so that the inbox's next lines do not meet a closed pipe.
    tokio::spawn(async move { tokio::io::copy(&mut lines, &mut tokio::io::sink()).await });
    (child, base)
}
