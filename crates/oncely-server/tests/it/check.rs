//! `oncely check URL` against servers that keep the contract (oncely's own service, the
//! `payments` example) and against broken ones kept here as fixtures: it must pass the first and
//! name exactly the rows the second break.

use std::collections::{BTreeSet, HashMap};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use oncely::IdempotencyKey;
use oncely_server::check::{self, CheckConfig, Report, Verdict};
use oncely_testdb::TestDb;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use url::Url;

use crate::gateway_express::Express;
use crate::support::{both_databases, spawn_app_on, spawn_gateway};

/// The rows a server that ignores the key fails: every one about the key (not key-per-route,
/// which a server that runs everything anew passes, nor retry-after, with no 409 to carry it).
const IGNORES_THE_KEY: [&str; 6] = [
    "key-missing",
    "key-malformed",
    "replay",
    "replay-header",
    "reuse-other-body",
    "concurrent",
];

/// Runs the checker on `config` and asserts that nothing fails and that every row that can
/// always be checked passes (key-per-route needs --other-url, retry-after a 409). Prints the
/// table. The gateway's test calls this with the gateway's URL in front of its upstream.
pub async fn assert_conforms(config: &CheckConfig) -> Report {
    let report = check::run(config).await.expect("the route answers");
    println!("{}", report.table());
    assert_eq!(failures(&report), BTreeSet::new(), "{}", report.table());
    for name in [
        "key-missing",
        "key-malformed",
        "first-request",
        "replay",
        "replay-header",
        "reuse-other-body",
        "concurrent",
    ] {
        assert_eq!(
            report.row(name).unwrap().verdict,
            Verdict::Pass,
            "{name}: {}",
            report.table()
        );
    }
    report
}

fn failures(report: &Report) -> BTreeSet<&'static str> {
    report.failures().into_iter().collect()
}

fn set(names: &[&'static str]) -> BTreeSet<&'static str> {
    names.iter().copied().collect()
}

fn url(text: &str) -> Url {
    Url::parse(text).unwrap()
}

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
    let count: Value = oncely_testdb::http()
        .get(probe)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    let report = check::run(&direct).await.unwrap();
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
// Fixtures: small servers, one broken way each

/// How a fixture behaves.
#[derive(Debug, Clone, Copy, Default)]
struct Behaviour {
    /// Runs every POST, key or not: a fresh id per call.
    ignores_key: bool,
    /// With `ignores_key`: answers the same constant body every time (as a signup does), so
    /// only a probe can tell how often it ran.
    constant_answer: bool,
    /// A stored answer is replayed only for the same body (else 422); without it, for any
    /// body: it stores by key only.
    compares_body: bool,
    /// Keys are scoped by route; without it one key is one key on every route.
    per_route: bool,
    /// While a key's first request runs, duplicates get 409 (with `Retry-After` if `Some(true)`);
    /// the first request of the burst after a probe waits for `burst - 1` of them. Without it,
    /// requests are served one at a time (duplicates wait, then replay).
    conflicts: Option<bool>,
    /// Answers the first this many POSTs `503` with `Retry-After: 0` (busy, come back now).
    busy_first: usize,
}

const CORRECT: Behaviour = Behaviour {
    ignores_key: false,
    constant_answer: false,
    busy_first: 0,
    compares_body: true,
    per_route: true,
    conflicts: None,
};

struct Fixture {
    behaviour: Behaviour,
    burst: usize,
    executions: AtomicI64,
    keys: std::sync::Mutex<HashMap<(String, String), Stored>>,
    one_at_a_time: tokio::sync::Mutex<()>,
    /// Set by a probe: the next new key is a burst's.
    hold_next: AtomicBool,
    conflicts: tokio::sync::watch::Sender<usize>,
    busy_left: std::sync::atomic::AtomicUsize,
}

enum Stored {
    Running,
    Done { request: Bytes, id: i64 },
}

fn problem(status: StatusCode, kind: &str) -> Response {
    (
        status,
        [("content-type", "application/problem+json")],
        json!({ "type": format!("https://fixture.test/problems/{kind}") }).to_string(),
    )
        .into_response()
}

fn created(id: i64, replayed: bool, echo: Option<&str>) -> Response {
    let mut body = json!({ "id": id });
    if let Some(echo) = echo {
        body["authorization"] = json!(echo);
    }
    let mut response = (StatusCode::CREATED, axum::Json(body)).into_response();
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", "true".parse().unwrap());
    }
    response
}

async fn fixture_post(
    State(fixture): State<Arc<Fixture>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let b = fixture.behaviour;
    let busy = fixture
        .busy_left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    if busy.is_ok() {
        let mut response = problem(StatusCode::SERVICE_UNAVAILABLE, "busy");
        response
            .headers_mut()
            .insert("retry-after", "0".parse().unwrap());
        return response;
    }
    if b.ignores_key {
        // Careless in every way: it even echoes the caller's credentials.
        let echo = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let id = fixture.executions.fetch_add(1, Ordering::SeqCst) + 1;
        if b.constant_answer {
            return (
                StatusCode::ACCEPTED,
                axum::Json(json!({ "status": "accepted" })),
            )
                .into_response();
        }
        return created(id, false, echo.as_deref());
    }
    let key = match IdempotencyKey::from_headers(&headers) {
        Ok(key) => key.as_str().to_owned(),
        Err(oncely::KeyError::Missing) => {
            return problem(StatusCode::BAD_REQUEST, "idempotency-key-missing");
        }
        Err(_) => return problem(StatusCode::BAD_REQUEST, "idempotency-key-invalid"),
    };
    let scope = (
        if b.per_route {
            uri.path().to_owned()
        } else {
            String::new()
        },
        key,
    );
    let _serial = match b.conflicts {
        None => Some(fixture.one_at_a_time.lock().await),
        Some(_) => None,
    };
    let hold = {
        let mut keys = fixture.keys.lock().unwrap();
        match keys.get(&scope) {
            Some(Stored::Done { request, id }) => {
                return if b.compares_body && *request != body {
                    problem(StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused")
                } else {
                    created(*id, true, None)
                };
            }
            Some(Stored::Running) => {
                fixture.conflicts.send_modify(|n| *n += 1);
                let mut response = problem(StatusCode::CONFLICT, "idempotency-key-in-use");
                if b.conflicts == Some(true) {
                    response
                        .headers_mut()
                        .insert("retry-after", "1".parse().unwrap());
                }
                return response;
            }
            None => {
                keys.insert(scope.clone(), Stored::Running);
                b.conflicts.is_some() && fixture.hold_next.swap(false, Ordering::SeqCst)
            }
        }
    };
    if hold {
        let mut conflicts = fixture.conflicts.subscribe();
        let want = fixture.burst - 1;
        conflicts.wait_for(|n| *n >= want).await.unwrap();
    }
    let id = fixture.executions.fetch_add(1, Ordering::SeqCst) + 1;
    fixture
        .keys
        .lock()
        .unwrap()
        .insert(scope, Stored::Done { request: body, id });
    created(id, false, None)
}

async fn fixture_count(State(fixture): State<Arc<Fixture>>) -> axum::Json<Value> {
    if fixture.behaviour.conflicts.is_some() {
        fixture.conflicts.send_replace(0);
        fixture.hold_next.store(true, Ordering::SeqCst);
    }
    axum::Json(json!({ "count": fixture.executions.load(Ordering::SeqCst) }))
}

/// A fixture on a free port: `POST /a`, `POST /b`, `GET /count`. Returns its base URL.
async fn spawn_fixture(behaviour: Behaviour, burst: usize) -> String {
    let fixture = Arc::new(Fixture {
        behaviour,
        burst,
        executions: AtomicI64::new(0),
        keys: std::sync::Mutex::new(HashMap::new()),
        one_at_a_time: tokio::sync::Mutex::new(()),
        hold_next: AtomicBool::new(false),
        conflicts: tokio::sync::watch::Sender::new(0),
        busy_left: std::sync::atomic::AtomicUsize::new(behaviour.busy_first),
    });
    let app = Router::new()
        .route("/a", post(fixture_post))
        .route("/b", post(fixture_post))
        .route("/count", get(fixture_count))
        .with_state(fixture);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// The checker's configuration for a fixture: route `/a`, `/b` as the other route, the
/// probe `/count`, `burst` at once.
fn fixture_config(base: &str, burst: usize) -> CheckConfig {
    let mut config = CheckConfig::new(url(&format!("{base}/a")))
        .body(r#"{"amount":10}"#)
        .other_url(url(&format!("{base}/b")))
        .probe(url(&format!("{base}/count")));
    config.concurrency = burst;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fixture_that_keeps_the_contract_passes_every_row_but_retry_after() {
    let base = spawn_fixture(CORRECT, 6).await;
    let report = assert_conforms(&fixture_config(&base, 6)).await;
    assert_eq!(report.row("key-per-route").unwrap().verdict, Verdict::Pass);
    assert_eq!(
        report.row("retry-after").unwrap().verdict,
        Verdict::NotApplicable,
        "{}",
        report.table()
    );
    assert!(
        report
            .row("concurrent")
            .unwrap()
            .evidence
            .contains("probe 3 → 4"),
        "{}",
        report.table()
    );
}

/// A busy answer with `Retry-After` is load, not a verdict: the checker waits and sends the
/// same request again, and says how often it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn busy_answers_outside_the_burst_are_retried_after_their_retry_after() {
    let base = spawn_fixture(
        Behaviour {
            busy_first: 3,
            ..CORRECT
        },
        6,
    )
    .await;
    let report = assert_conforms(&fixture_config(&base, 6)).await;
    assert_eq!(report.busy_retries, 3);
    assert!(
        report
            .table()
            .contains("(3 busy answers retried after its Retry-After)"),
        "{}",
        report.table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_ignores_the_key_fails_the_rows_that_need_one() {
    let base = spawn_fixture(
        Behaviour {
            ignores_key: true,
            ..CORRECT
        },
        6,
    )
    .await;
    let report = check::run(&fixture_config(&base, 6)).await.unwrap();
    assert_eq!(
        failures(&report),
        set(&IGNORES_THE_KEY),
        "{}",
        report.table()
    );
    let concurrent = &report.row("concurrent").unwrap().evidence;
    assert!(
        concurrent.contains("the probe counted 7 executions"),
        "the probe counted every request, the retry after the burst too: {concurrent}"
    );
    // Without a probe, the answers differ (a fresh id each): still a failure.
    let mut config = fixture_config(&base, 6);
    config.probe = None;
    let report = check::run(&config).await.unwrap();
    assert!(
        failures(&report).contains("concurrent"),
        "{}",
        report.table()
    );
    assert!(
        report
            .row("concurrent")
            .unwrap()
            .evidence
            .contains("different success bodies"),
        "{}",
        report.table()
    );
}

/// Same answers every time: the answers cannot tell one execution from seven, the probe can.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_probe_catches_a_server_that_runs_every_duplicate_with_the_same_answer() {
    let base = spawn_fixture(
        Behaviour {
            ignores_key: true,
            constant_answer: true,
            ..CORRECT
        },
        6,
    )
    .await;
    let report = check::run(&fixture_config(&base, 6)).await.unwrap();
    let concurrent = report.row("concurrent").unwrap();
    assert_eq!(concurrent.verdict, Verdict::Fail, "{}", report.table());
    assert!(
        concurrent
            .evidence
            .contains("the probe counted 7 executions"),
        "{}",
        concurrent.evidence
    );
    // The replay is byte for byte the same, but it is not marked as one.
    assert_eq!(report.row("replay").unwrap().verdict, Verdict::Pass);
    assert_eq!(report.row("replay-header").unwrap().verdict, Verdict::Fail);

    let mut config = fixture_config(&base, 6);
    config.probe = None;
    let report = check::run(&config).await.unwrap();
    let concurrent = report.row("concurrent").unwrap();
    assert_eq!(concurrent.verdict, Verdict::Pass, "{}", report.table());
    assert!(
        concurrent
            .evidence
            .contains("compared answers (no --probe)"),
        "{}",
        concurrent.evidence
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_stores_by_key_only_fails_reuse_with_another_body() {
    let base = spawn_fixture(
        Behaviour {
            compares_body: false,
            ..CORRECT
        },
        6,
    )
    .await;
    let report = check::run(&fixture_config(&base, 6)).await.unwrap();
    assert_eq!(
        failures(&report),
        set(&["reuse-other-body"]),
        "{}",
        report.table()
    );
    let evidence = &report.row("reuse-other-body").unwrap().evidence;
    assert!(
        evidence.contains("expected 422, got 201") && evidence.contains("Idempotent-Replayed"),
        "{evidence}"
    );
    for name in [
        "key-missing",
        "replay",
        "replay-header",
        "key-per-route",
        "concurrent",
    ] {
        assert_eq!(
            report.row(name).unwrap().verdict,
            Verdict::Pass,
            "{}",
            report.table()
        );
    }

    // The same, one key for every route: the other route replays the first one's answer.
    let base = spawn_fixture(
        Behaviour {
            compares_body: false,
            per_route: false,
            ..CORRECT
        },
        6,
    )
    .await;
    let report = check::run(&fixture_config(&base, 6)).await.unwrap();
    assert_eq!(
        failures(&report),
        set(&["reuse-other-body", "key-per-route"]),
        "{}",
        report.table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conflicts_in_the_burst_pass_with_retry_after_and_fail_without() {
    let base = spawn_fixture(
        Behaviour {
            conflicts: Some(true),
            ..CORRECT
        },
        5,
    )
    .await;
    let report = assert_conforms(&fixture_config(&base, 5)).await;
    let row = report.row("retry-after").unwrap();
    assert_eq!(row.verdict, Verdict::Pass, "{}", report.table());
    assert!(
        row.evidence.contains("409×4 with Retry-After (1)"),
        "{}",
        row.evidence
    );

    let base = spawn_fixture(
        Behaviour {
            conflicts: Some(false),
            ..CORRECT
        },
        5,
    )
    .await;
    let report = check::run(&fixture_config(&base, 5)).await.unwrap();
    assert_eq!(
        failures(&report),
        set(&["retry-after"]),
        "{}",
        report.table()
    );
    assert_eq!(
        report.row("concurrent").unwrap().verdict,
        Verdict::Pass,
        "{}",
        report.table()
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
        check::ROWS
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
