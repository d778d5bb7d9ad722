//! `oncely check URL` against servers that keep the contract (oncely's own service, the
//! `payments` example, an Express app behind the gateway) and the `oncely check` binary: exit
//! codes, output, input errors. The checker against fixtures is `oncely-check`'s own test.

use std::process::Stdio;

use oncely_check::{CheckConfig, Verdict};
use oncely_testdb::TestDb;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::gateway_express::Express;
use crate::support::{both_databases, spawn_app_on, spawn_gateway};

/// The fixtures and assertions of `oncely-check`'s tests.
#[path = "../../../oncely-check/tests/support/mod.rs"]
pub mod fixtures;
pub use fixtures::assert_conforms;
use fixtures::{Behaviour, CORRECT, IGNORES_THE_KEY, failures, set, spawn_fixture, url};

// ---------------------------------------------------------------------------------------------
// Servers that keep the contract

both_databases!(the_checker_passes_against_oncelys_own_signup);

async fn the_checker_passes_against_oncelys_own_signup(database_url: String, _db: TestDb) {
    let app = spawn_app_on(&database_url, |_| {}).await;
    let mut config = CheckConfig::new(url(&format!("{}/v1/signup", app.base)))
        .body(r#"{"email":"check-{{unique}}@example.com","password":"correct horse battery"}"#)
        .other_url(url(&format!("{}/v1/password-reset", app.base)));
    config.other_body = Some(r#"{"email":"check-{{unique}}@example.com"}"#.into());
    let report = assert_conforms(&config).await;
    assert_eq!(
        report.row("key-per-route").unwrap().verdict,
        Verdict::Pass,
        "{}",
        report.table()
    );
    assert!(
        report
            .row("concurrent")
            .unwrap()
            .evidence
            .contains("compared answers"),
        "without a probe the row says it compared answers: {}",
        report.table()
    );
    assert!(
        report
            .row("key-missing")
            .unwrap()
            .evidence
            .contains("idempotency-key-missing"),
        "{}",
        report.table()
    );
}

/// The `payments` example (`cargo build -p oncely --example payments`; `cargo test
/// --workspace` and scripts/test build it), next to this test's executable.
fn payments_example() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe
        .parent()?
        .parent()?
        .join("examples")
        .join(format!("payments{}", std::env::consts::EXE_SUFFIX));
    path.exists().then_some(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checker_passes_against_the_payments_example_and_its_probe_counts_one_execution() {
    let Some(example) = payments_example() else {
        // Straight to the process's stderr: libtest captures `eprintln!`, not this.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: the_checker_passes_against_the_payments_example: the example is not built \
             (cargo build -p oncely --example payments; cargo test --workspace builds it)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(example)
        .env("PAYMENTS_ADDR", "127.0.0.1:0")
        .env(
            "PAYMENTS_DB",
            format!("sqlite://{}", dir.path().join("payments.db").display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let base = loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("the example prints its address");
        if let Some(rest) = line.strip_prefix("POST ") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let probe = url(&base.replace("/payments", "/payments/count"));
    let config = CheckConfig::new(url(&base))
        .body(r#"{"amount":10}"#)
        .probe(probe.clone());
    let report = assert_conforms(&config).await;
    let concurrent = &report.row("concurrent").unwrap().evidence;
    assert!(concurrent.contains("probe"), "{}", report.table());
    // The example's own count: the rows that ran the handler, each once — first-request,
    // reuse-other-body's own first request, the concurrent burst.
    let count: Value = crate::requests::json_of(oncely_testdb::http().get(probe)).await;
    assert_eq!(count, json!({ "count": 3 }), "{}", report.table());
}

/// The deliberately non-idempotent Express signup (examples/express-signup): straight to it the
/// checker fails it exactly where a server that ignores keys fails; behind `oncely gateway` it
/// passes, and the application's own probe (`GET /count`: rows and emails) counts one execution
/// for the concurrent burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checker_fails_the_express_app_alone_and_passes_it_behind_the_gateway() {
    let Some(express) = Express::start("the_checker_fails_the_express_app_alone…").await else {
        return;
    };
    let body = r#"{"email":"check-{{unique}}@example.com"}"#;
    let direct = CheckConfig::new(url(&format!("{}/signup", express.base)))
        .body(body)
        .other_url(url(&format!("{}/echo", express.base)))
        .probe(url(&format!("{}/count", express.base)));
    let report = oncely_check::run(&direct).await.unwrap();
    assert_eq!(
        failures(&report),
        set(&IGNORES_THE_KEY),
        "{}",
        report.table()
    );

    let db = oncely_testdb::TestSqlite::new();
    let routes = ["--route", "POST /signup", "--route", "POST /echo"];
    let gateway = spawn_gateway(db.url(), &express.base, &routes).await;
    let behind = CheckConfig::new(url(&format!("{}/signup", gateway.base)))
        .body(body)
        .other_url(url(&format!("{}/echo", gateway.base)))
        .probe(url(&format!("{}/count", gateway.base)));
    let report = assert_conforms(&behind).await;
    assert_eq!(
        report.row("key-per-route").unwrap().verdict,
        Verdict::Pass,
        "{}",
        report.table()
    );
    let concurrent = &report.row("concurrent").unwrap().evidence;
    assert!(
        concurrent.contains("rows "),
        "the probe's counts: {concurrent}"
    );
}

// ---------------------------------------------------------------------------------------------
// The binary: exit codes, output, input errors

async fn oncely_check(args: &[&str]) -> (Option<i32>, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .arg("check")
        .args(args)
        .output()
        .await
        .unwrap();
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_binary_exits_1_naming_the_failed_rows_and_never_prints_the_auth_header() {
    let base = spawn_fixture(
        Behaviour {
            ignores_key: true,
            ..CORRECT
        },
        10,
    )
    .await;
    let a = format!("{base}/a");
    let (code, stdout, stderr) = oncely_check(&[
        &a,
        "--body",
        r#"{"amount":10}"#,
        "-H",
        "Authorization: Bearer s3cret-token-of-the-caller",
    ])
    .await;
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    for name in ["key-missing", "replay", "reuse-other-body", "concurrent"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row {name}: {stdout}"));
        assert!(line.contains(" fail "), "{line}");
    }
    assert!(stdout.contains("compared answers (no --probe)"), "{stdout}");
    assert!(stdout.contains("9 rows: 1 pass, 6 fail, 2 n/a"), "{stdout}");
    assert!(
        stderr.contains("6 of 9 rows failed: key-missing, key-malformed, replay"),
        "{stderr}"
    );
    // The fixture echoes the Authorization header in its bodies, and excerpts print bodies.
    assert!(stdout.contains("[redacted]"), "{stdout}");
    assert!(
        !stdout.contains("s3cret") && !stderr.contains("s3cret"),
        "{stdout}\n{stderr}"
    );

    // --json: one document with every row.
    let (code, stdout, _) = oncely_check(&[&a, "--body", r#"{"amount":10}"#, "--json"]).await;
    assert_eq!(code, Some(1));
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        oncely_check::ROWS
    );
    assert_eq!(rows[0]["verdict"], "fail");
    assert_eq!(report["failed"], 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_binary_exits_0_when_every_row_passes_or_is_not_applicable() {
    let base = spawn_fixture(CORRECT, 10).await;
    let (code, stdout, stderr) = oncely_check(&[
        &format!("{base}/a"),
        "--body",
        r#"{"amount":10}"#,
        "--probe",
        &format!("{base}/count"),
    ])
    .await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("9 rows: 7 pass, 0 fail, 2 n/a"), "{stdout}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[tokio::test]
async fn bad_input_is_a_usage_error_and_an_unreachable_url_one_line() {
    for args in [
        vec!["not a url"],
        vec!["ftp://example.com/x"],
        vec!["http://127.0.0.1:1/x", "-H", "Authorization Bearer x"],
        vec![
            "http://127.0.0.1:1/x",
            "--body",
            "{}",
            "--body-file",
            "Cargo.toml",
        ],
        vec![
            "http://127.0.0.1:1/x",
            "--body-file",
            "/nonexistent/body.json",
        ],
        vec!["http://127.0.0.1:1/x", "--concurrency", "1"],
        vec!["http://127.0.0.1:1/x", "-H", "Idempotency-Key: mine"],
    ] {
        let (code, stdout, stderr) = oncely_check(&args).await;
        assert_eq!(code, Some(2), "{args:?}: {stdout}\n{stderr}");
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    }

    // A port nobody listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let (code, stdout, stderr) = oncely_check(&[&format!("http://{addr}/x")]).await;
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "oncely: cannot reach http://{addr}/x: cannot connect"
        )),
        "{stderr}"
    );
}
