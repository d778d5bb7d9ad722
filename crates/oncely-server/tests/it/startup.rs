//! What the binary prints and refuses before it serves.

use std::process::Output;

use crate::support::SECRET;

async fn oncely(args: &[&str], env: &[(&str, &str)]) -> Output {
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
}
