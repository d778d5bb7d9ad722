//! What the binary prints and refuses before it serves.

use std::process::Output;

use crate::support::SECRET;

pub(crate) async fn oncely(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"));
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    // A refused configuration exits at once; one that starts serving would run forever.
    tokio::time::timeout(std::time::Duration::from_secs(60), command.output())
        .await
        .expect("oncely started serving instead of refusing the configuration")
        .unwrap()
}

/// `serve` on a SQLite file in `dir`, loopback, an unreachable SMTP mailer: every setting a
/// start-up check reads comes from `env` and the extra arguments.
fn serve_args(dir: &tempfile::TempDir) -> Vec<String> {
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("o.db").display());
    [
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--database-url",
        &url,
        "--mailer",
        "smtp://127.0.0.1:9",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Regression: clap showed `[env: ONCELY_MAILER=smtps://user:password@…]` in `--help`.
#[tokio::test]
async fn help_shows_no_secret_from_the_environment() {
    let env = [
        (
            "ONCELY_MAILER",
            "smtps://mailer-user:smtp-password-1@smtp.example.com:465",
        ),
        ("ONCELY_SMTP_PASSWORD", "smtp-password-2"),
        ("ONCELY_MAILER_API_KEY", "mailer-api-key-3"),
        ("ONCELY_SECRET", "server-secret-4-server-secret-4-server"),
        ("DATABASE_URL", "postgres://app:db-password-5@db/oncely"),
        (
            "ONCELY_SECRET_PREVIOUS",
            "previous-secret-6-previous-secret-6-x",
        ),
    ];
    for command in [&["serve", "--help"][..], &["worker", "--help"]] {
        let mut command_env = env.to_vec();
        command_env.push(("RUST_LOG", "info"));
        let output = oncely(command, &command_env).await;
        assert!(output.status.success());
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(printed.contains("ONCELY_SMTP_PASSWORD"), "{printed}");
        for secret in [
            "smtp-password-1",
            "smtp-password-2",
            "mailer-api-key-3",
            "previous-secret-6",
            "server-secret-4",
            "db-password-5",
        ] {
            assert!(
                !printed.contains(secret),
                "{secret} in {command:?}: {printed}"
            );
        }
    }
}

/// Regression: production started without `ONCELY_PUBLIC_URL` and mailed links to
/// `http://0.0.0.0:8080`.
#[tokio::test]
async fn production_without_a_public_url_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let serve = serve_args(&dir);
    let serve_in_production = async |extra: &[&str]| {
        let mut args: Vec<&str> = serve.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        let env = [("ONCELY_ENV", "production"), ("ONCELY_SECRET", SECRET)];
        oncely(&args, &env).await
    };
    let output = serve_in_production(&[]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("ONCELY_PUBLIC_URL is required in production"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one clear line: {stderr}");
    let bad = serve_in_production(&["--public-url", "https://accounts.example.com/?x=1"]).await;
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("must not have a query"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// Issue 15, item 1: `ONCELY_POLL_ONLY=1`, as docs/operations.md writes it, was refused
/// (`possible values: true, false`): a boolean variable takes 1/0, true/false, yes/no, on/off.
#[tokio::test]
async fn a_boolean_variable_takes_the_usual_spellings() {
    let dir = tempfile::tempdir().unwrap();
    let serve = serve_args(&dir);
    // Production without a public URL: refused after the command line was read, so reaching
    // that refusal proves the variable was taken.
    let args: Vec<&str> = serve.iter().map(String::as_str).collect();
    for value in ["1", "0", "yes", "no", "on", "off", "true", "false"] {
        let env = [
            ("ONCELY_ENV", "production"),
            ("ONCELY_SECRET", SECRET),
            ("ONCELY_POLL_ONLY", value),
        ];
        let output = oncely(&args, &env).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("ONCELY_PUBLIC_URL is required"),
            "ONCELY_POLL_ONLY={value}: {stderr}"
        );
    }
    let env = [("ONCELY_POLL_ONLY", "maybe")];
    let output = oncely(&args, &env).await;
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("oncely: ONCELY_POLL_ONLY=maybe: ")
            && stderr.contains("yes")
            && stderr.trim().lines().count() == 1,
        "the variable that was set is named, in one line: {stderr}"
    );
}

/// stderr of a refused command: one line, which it returns (without the `oncely: ` prefix).
pub(crate) fn refusal(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "refused: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    stderr
        .trim()
        .strip_prefix("oncely: ")
        .unwrap_or_else(|| panic!("starts with `oncely: `: {stderr}"))
        .to_owned()
}

/// Issue 15, item 1: clap named the flag (`--env <ENVIRONMENT>`) of a value that came from a
/// variable the user set; now the variable is named, with its value (unless hidden).
#[tokio::test]
async fn a_bad_value_from_the_environment_names_its_variable() {
    for (variable, value, says) in [
        (
            "ONCELY_ENV",
            "prod",
            "invalid value (possible values: development, production)",
        ),
        ("ONCELY_DATABASE_POOL", "1", "1 is not in 2..=1000"),
        ("ONCELY_BIND", "localhost", "invalid socket address syntax"),
        ("ONCELY_LEASE", "soon", "(examples: 30s, 15m, 24h)"),
    ] {
        let output = oncely(&["serve"], &[(variable, value)]).await;
        assert_eq!(output.status.code(), Some(2), "clap's status");
        let line = refusal(&output);
        assert!(
            line.starts_with(&format!("{variable}={value}: ")) && line.contains(says),
            "{line}"
        );
    }
    // Typed on the command line, the flag is what was wrong: clap says so, as before.
    let output = oncely(&["serve", "--env", "prod"], &[("ONCELY_ENV", "production")]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("'--env <ENVIRONMENT>'") && !stderr.contains("ONCELY_ENV="),
        "{stderr}"
    );
}

/// Issue 15, item 1: each of these started (and failed later, or silently): docs/operations.md
/// says start-up refuses them in one line.
#[tokio::test]
async fn production_refuses_placeholders_a_mailer_without_host_and_the_default_database() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("o.db").display());
    let production = async |extra: &[&str], secret: &str| {
        let mut args = vec![
            "serve",
            "--bind",
            "127.0.0.1:0",
            "--public-url",
            "https://accounts.example.com",
        ];
        args.extend_from_slice(extra);
        let env = [("ONCELY_ENV", "production"), ("ONCELY_SECRET", secret)];
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"));
        command
            .args(&args)
            .env_remove("DATABASE_URL")
            .envs(env)
            .current_dir(dir.path())
            .kill_on_drop(true);
        tokio::time::timeout(std::time::Duration::from_secs(60), command.output())
            .await
            .expect("refused, not serving")
            .unwrap()
    };
    let mailer = ["--mailer", "smtp://127.0.0.1:9"];
    let on_file = [&["--database-url", url.as_str()][..], &mailer].concat();
    let spaces = " ".repeat(32);
    for placeholder in [spaces.as_str(), "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"] {
        let line = refusal(&production(&on_file, placeholder).await);
        assert!(line.starts_with("ONCELY_SECRET is a placeholder"), "{line}");
    }
    let no_host = ["--database-url", url.as_str(), "--mailer", "https://"];
    let line = refusal(&production(&no_host, SECRET).await);
    assert!(
        line.starts_with("ONCELY_MAILER=https://… names no host"),
        "{line}"
    );
    let line = refusal(&production(&mailer, SECRET).await);
    assert!(
        line.starts_with("DATABASE_URL=sqlite://oncely.db is the development default"),
        "{line}"
    );
    assert!(!dir.path().join("oncely.db").exists(), "nothing created");
}

/// Issue 15, item 1: a refused connection said "pool timed out" after 5 s; a missing database
/// or SQLite directory said it in driver words, and `oncely inbox` on a busy port did not say
/// which.
#[tokio::test]
async fn connection_and_listening_errors_say_what_and_where_in_one_line() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("postgres://postgres:hunter2@127.0.0.1:{port}/oncely");
    for command in [&["outbox", "list"][..], &["serve", "--bind", "127.0.0.1:0"]] {
        let args = [command, &["--database-url", &url]].concat();
        let line = refusal(&oncely(&args, &[]).await);
        assert_eq!(
            line,
            format!(
                "DATABASE_URL=postgres://postgres:***@127.0.0.1:{port}/oncely: connection refused to 127.0.0.1:{port} (is PostgreSQL running there?)"
            )
        );
    }
    let server = oncely_testdb::server_url();
    let (base, _) = server.rsplit_once('/').unwrap();
    let missing = format!("{base}/oncely_no_such_database");
    let line = refusal(&oncely(&["migrate", "--database-url", &missing], &[]).await);
    assert!(
        line.contains("database \"oncely_no_such_database\" does not exist on ")
            && line.contains("createdb"),
        "{line}"
    );

    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("missing");
    let sqlite = format!("sqlite://{}", nowhere.join("o.db").display());
    for command in [&["migrate"][..], &["serve", "--bind", "127.0.0.1:0"]] {
        let args = [command, &["--database-url", &sqlite]].concat();
        let line = refusal(&oncely(&args, &[]).await);
        assert_eq!(
            line,
            format!(
                "DATABASE_URL={sqlite}: the directory {} does not exist (create it, or fix DATABASE_URL)",
                nowhere.display()
            )
        );
    }
    assert!(!nowhere.exists());

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = busy.local_addr().unwrap().to_string();
    let line = refusal(&oncely(&["inbox", "--smtp", &busy, "--http", "127.0.0.1:0"], &[]).await);
    assert!(
        line.starts_with(&format!("cannot listen on {busy} (SMTP): ")),
        "{line}"
    );
}

/// Issue 15, item 3: `oncely worker` in development without a mailer mailed into an inbox of
/// its own that nobody saw.
#[tokio::test]
async fn a_worker_with_the_dev_mailer_is_refused_and_told_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("o.db").display());
    for env in [&[][..], &[("ONCELY_MAILER", "dev")]] {
        let line = refusal(&oncely(&["worker", "--database-url", &url], env).await);
        assert!(
            line.starts_with("ONCELY_MAILER")
                && line.contains("nobody sees")
                && line.contains("oncely inbox"),
            "{line}"
        );
    }
}

crate::support::both_databases!(one_database_has_one_dev_inbox_and_the_banner_says_who_serves_it);

/// Issue 15, item 3: two `serve` processes of one database each ran a dev inbox of their own,
/// and the emails split between them; the banner promised an inbox whatever the bind or
/// `--workers` said. Now the process whose workers mail into it holds it, another one with
/// workers is refused (naming the first), one with `--workers 0` points to the first, and a
/// crashed holder blocks nobody.
async fn one_database_has_one_dev_inbox_and_the_banner_says_who_serves_it(
    url: String,
    _db: oncely_testdb::TestDb,
) {
    use crate::support::spawn_binary;
    let mut first = spawn_binary(&url, "dev", &[], &[]).await;
    let page = format!("{}/_dev/inbox", first.base);
    assert!(
        first.banner[1].starts_with(&format!(
            "dev inbox:    {page}   (JSON: /_dev/inbox/messages; SMTP 127.0.0.1:"
        )),
        "{:?}",
        first.banner
    );
    let client = oncely_testdb::http();
    let served = client.get(format!("{page}/messages")).send().await.unwrap();
    assert_eq!(served.status(), 200);

    let second = [
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--database-url",
        &url,
        "--mailer",
        "dev",
        "--secret",
        SECRET,
    ];
    let line = refusal(&oncely(&second, &[]).await);
    let pid = first.child.id().unwrap();
    let refused = format!(
        "the dev inbox of this database is served by another `oncely serve` ({page} (pid {pid})), whose workers send the emails: start this one with --workers 0 (ONCELY_WORKERS), or stop that one"
    );
    assert_eq!(line, refused);
    // The same file by another path (review of issue 15: a symbolic link got its own inbox).
    if let Some(file) = url.strip_prefix("sqlite://") {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(file, &link).unwrap();
        let by_link = format!("sqlite://{}", link.display());
        let mut second = second;
        second[4] = &by_link;
        assert_eq!(refusal(&oncely(&second, &[]).await), refused);
    }
    let api_only = spawn_binary(&url, "dev", &["--workers", "0"], &[]).await;
    assert_eq!(
        api_only.banner[1],
        format!(
            "dev inbox:    served by another `oncely serve` of this database: {page} (pid {pid}) (this one has --workers 0)"
        )
    );
    let page_here = client
        .get(format!("{}/_dev/inbox/messages", api_only.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page_here.status(), 404, "not served where it is not");

    // A crash (SIGKILL) releases it: the next `serve` with workers holds it.
    first.child.kill().await.unwrap();
    first.child.wait().await.unwrap();
    let next = spawn_binary(&url, "dev", &[], &[]).await;
    assert!(
        next.banner[1].starts_with(&format!("dev inbox:    {}/_dev/inbox ", next.base)),
        "{:?}",
        next.banner
    );
}

/// Issue 15, item 3: the banner printed the dev inbox whenever the mailer was `dev`; it is
/// served only on a loopback bind and only by a process whose workers mail into it.
#[tokio::test]
async fn the_banner_says_why_the_dev_inbox_is_off() {
    use crate::support::spawn_binary;
    for (mailer, extra, says) in [
        (
            "dev",
            &["--workers", "0"][..],
            "dev inbox:    off (--workers 0: this process sends no email; emails wait for `oncely worker` or a `serve` with workers)",
        ),
        (
            "smtp://127.0.0.1:9",
            &[],
            "dev inbox:    off (ONCELY_MAILER is set: emails go to that mailer)",
        ),
        (
            "dev",
            &["--bind", "0.0.0.0:0"],
            "dev inbox:    off (bind 0.0.0.0 is not loopback: the dev inbox is served on loopback only, and emails sent here are kept where nobody reads them; bind 127.0.0.1, or set ONCELY_MAILER)",
        ),
    ] {
        let db = oncely_testdb::TestSqlite::new();
        let process = spawn_binary(db.url(), mailer, extra, &[]).await;
        assert_eq!(process.banner[1], says);
        let base = process.base.replace("0.0.0.0", "127.0.0.1");
        let page = oncely_testdb::http()
            .get(format!("{base}/_dev/inbox/messages"))
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 404, "{says}");
    }
}

/// Issue 15, item 1: on PostgreSQL in development, `serve` and `worker` started from two
/// directories each wrote a `.oncely-secret` of their own, and every emailed link was
/// `token-invalid`. The generated secret lives in the database now: every process of it signs
/// alike, wherever it runs.
#[tokio::test]
async fn serve_and_worker_started_from_two_directories_share_the_development_secret() {
    use tokio::io::AsyncBufReadExt;
    let db = crate::support::migrated_postgres().await;
    let (inbox, running) = crate::support::start_inbox(oncely_inbox::Faults::default()).await;
    let mailer = format!("smtp://{}", running.smtp_addr);
    let (api_dir, worker_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let start = |dir: &tempfile::TempDir, args: &[&str]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"));
        command
            .args(args)
            .args(["--database-url", db.url(), "--mailer", &mailer])
            .env_remove("ONCELY_SECRET")
            .env_remove("DATABASE_URL")
            .current_dir(dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        command.spawn().unwrap()
    };
    // The first line; the rest is drained (a closed pipe would end the process).
    let first_line = async |child: &mut tokio::process::Child| {
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        first
    };
    let mut api = start(
        &api_dir,
        &["serve", "--bind", "127.0.0.1:0", "--workers", "0"],
    );
    let banner = first_line(&mut api).await;
    let base = banner
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_owned();
    let mut worker = start(&worker_dir, &["worker"]);
    assert!(first_line(&mut worker).await.starts_with("oncely worker:"));

    let client = oncely_testdb::http();
    let signup = client
        .post(format!("{base}/v1/signup"))
        .header("idempotency-key", "two-directories")
        .json(&serde_json::json!({ "email": "ada@example.com" }))
        .send()
        .await
        .unwrap();
    assert_eq!(signup.status(), 202);
    let email = inbox
        .wait_for("ada@example.com", 1, std::time::Duration::from_secs(10))
        .await;
    let token = crate::support::token_in(email.first().expect("the worker mailed"));
    let verified = client
        .post(format!("{base}/v1/verify"))
        .header("idempotency-key", "verify-two-directories")
        .json(&serde_json::json!({ "token": token }))
        .send()
        .await
        .unwrap();
    let status = verified.status();
    assert_eq!(status, 200, "{}", verified.text().await.unwrap());
    for dir in [&api_dir, &worker_dir] {
        assert!(!dir.path().join(".oncely-secret").exists());
    }
}

/// Review of issue 15: an operator command's failure printed its cause three times, with the
/// driver's framing ("error returned from database: (code: 8) attempt to write a readonly
/// database: error returned from database: …"): the one-line helper was used only at start-up.
#[tokio::test]
async fn an_operator_commands_failure_names_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ro.db");
    let url = format!("sqlite://{}", file.display());
    assert!(
        oncely(&["migrate", "--database-url", &url], &[])
            .await
            .status
            .success()
    );
    let read_only = format!("{url}?mode=ro");
    for json in [false, true] {
        let mut args = vec!["tenant", "create", "acme", "--database-url", &read_only];
        if json {
            args.push("--json");
        }
        let output = oncely(&args, &[]).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert_eq!(
            stderr.matches("readonly database").count(),
            1,
            "the cause once: {stderr}"
        );
        assert!(!stderr.contains("error returned from database"), "{stderr}");
    }
}

crate::support::both_databases!(processes_with_another_server_secret_are_refused);

/// Regression (review of issue 19): two processes of one database with different secrets each
/// answered 422 to the other's retries — and two gateways scoping by credential ran them again.
/// The database keeps a keyed hash of its processes' secret (the rules and rotations:
/// `oncely`'s `tests/it/shared_secret.rs`); the gateway, on the key store alone, checks the
/// same one as `serve` and `worker`, and the binary refuses another in one line.
async fn processes_with_another_server_secret_are_refused(url: String, _db: oncely_testdb::TestDb) {
    crate::support::migrate(&url).await;
    // A worker of the database (as `serve` and `worker` check it at start) uses SECRET.
    let (_inbox, mailer) = crate::requests::smtp_inbox().await;
    let mut worker = crate::support::spawn_worker(&url, &mailer).await;
    worker.kill().await.unwrap();
    let upstream = "http://127.0.0.1:9";
    let other = "another-secret-0123456789-0123456789-zyxw";
    let route = ["--route", "POST /a"];
    let refused = oncely(
        &[
            &[
                "gateway",
                "--database-url",
                &url,
                "--upstream",
                upstream,
                "--secret",
                other,
            ][..],
            &route[..],
        ]
        .concat(),
        &[],
    )
    .await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("ONCELY_SECRET is not the secret the other processes"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(other),
        "the secret is never printed: {stderr}"
    );
}

/// A production start on a PostgreSQL database that acknowledges commits before they are
/// durable (`synchronous_commit = off`) says so: a crash could lose an acknowledged signup,
/// or an email's point of no return (then sent twice). On the default, it says nothing.
#[tokio::test]
async fn production_warns_when_the_database_may_lose_acknowledged_commits() {
    let db = crate::support::migrated_postgres().await;
    crate::support::migrate(db.url()).await;
    let (_inbox, mailer) = crate::requests::smtp_inbox().await;
    let production = [
        ("ONCELY_ENV", "production"),
        ("ONCELY_PUBLIC_URL", "https://accounts.example.com"),
    ];
    let warning = "synchronous_commit is off";
    let logs = async || {
        let mut process = crate::support::spawn_binary(db.url(), &mailer, &[], &production).await;
        process.child.kill().await.unwrap();
        process.stderr.await.unwrap()
    };
    let durable = logs().await;
    assert!(!durable.contains(warning), "{durable}");
    let name = db
        .url()
        .rsplit('/')
        .next()
        .unwrap()
        .split('?')
        .next()
        .unwrap();
    crate::support::execute(
        db.url(),
        &format!("ALTER DATABASE \"{name}\" SET synchronous_commit = off"),
    )
    .await;
    let lossy = logs().await;
    assert!(lossy.contains(warning), "{lossy}");
}
