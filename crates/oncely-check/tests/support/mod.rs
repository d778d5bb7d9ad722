//! Test support for the checker: small servers kept as fixtures (one broken way each), and the
//! assertions the tests share. Also used by the end-to-end tests (`oncely-cli/tests/it/check.rs`:
//! the checker against oncely itself, the gateway, and the `oncely check` binary).

#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use oncely_check::{CheckConfig, Report, Verdict};
use serde_json::{Value, json};
use url::Url;

/// The rows a server that ignores the key fails: every one about the key (not key-per-route,
/// which a server that runs everything anew passes, nor retry-after, with no 409 to carry it).
pub const IGNORES_THE_KEY: [&str; 6] = [
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
    let report = oncely_check::run(config).await.expect("the route answers");
    println!("{}", report.table());
    assert_eq!(failures(&report), BTreeSet::new(), "{}", report.table());
    let always = |name: &&str| !["key-per-route", "retry-after"].contains(name);
    for name in oncely_check::ROWS.into_iter().filter(always) {
        assert_eq!(
            report.row(name).unwrap().verdict,
            Verdict::Pass,
            "{name}: {}",
            report.table()
        );
    }
    report
}

/// A fixture of `behaviour` (a burst of `burst`) and the checker's report on it.
pub async fn fixture_report(behaviour: Behaviour, burst: usize) -> (String, Report) {
    let base = spawn_fixture(behaviour, burst).await;
    let report = oncely_check::run(&fixture_config(&base, burst))
        .await
        .unwrap();
    (base, report)
}

/// Asserts that the rows `names` fail, and no other.
pub fn assert_fails(report: &Report, names: &[&'static str]) {
    assert_eq!(failures(report), set(names), "{}", report.table());
}

/// Asserts that the evidence of row `name` contains `part`.
pub fn assert_evidence(report: &Report, name: &str, part: &str) {
    let evidence = &report.row(name).unwrap().evidence;
    assert!(
        evidence.contains(part),
        "{name}: {evidence}\n{}",
        report.table()
    );
}

pub fn failures(report: &Report) -> BTreeSet<&'static str> {
    report.failures().into_iter().collect()
}

pub fn set(names: &[&'static str]) -> BTreeSet<&'static str> {
    names.iter().copied().collect()
}

pub fn url(text: &str) -> Url {
    Url::parse(text).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Fixtures: small servers, one broken way each

/// How a fixture behaves.
#[derive(Debug, Clone, Copy, Default)]
pub struct Behaviour {
    /// Runs every POST, key or not: a fresh id per call.
    pub ignores_key: bool,
    /// With `ignores_key`: answers the same constant body every time (as a signup does), so
    /// only a probe can tell how often it ran.
    pub constant_answer: bool,
    /// A stored answer is replayed only for the same body (else 422); without it, for any
    /// body: it stores by key only.
    pub compares_body: bool,
    /// Keys are scoped by route; without it one key is one key on every route.
    pub per_route: bool,
    /// While a key's first request runs, duplicates get 409 (with `Retry-After` if `Some(true)`);
    /// the first request of the burst after a probe waits for `burst - 1` of them. Without it,
    /// requests are served one at a time (duplicates wait, then replay).
    pub conflicts: Option<bool>,
    /// Answers the first this many POSTs `503` with `Retry-After: 0` (busy, come back now).
    pub busy_first: usize,
}

/// [`CORRECT`] but for what `change` changes.
pub fn behaving(change: impl FnOnce(&mut Behaviour)) -> Behaviour {
    let mut behaviour = CORRECT;
    change(&mut behaviour);
    behaviour
}

pub const CORRECT: Behaviour = Behaviour {
    ignores_key: false,
    constant_answer: false,
    busy_first: 0,
    compares_body: true,
    per_route: true,
    conflicts: None,
};

pub struct Fixture {
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

pub enum Stored {
    Running,
    Done { request: Bytes, id: i64 },
}

pub fn problem(status: StatusCode, kind: &str) -> Response {
    (
        status,
        [("content-type", "application/problem+json")],
        json!({ "type": format!("https://fixture.test/problems/{kind}") }).to_string(),
    )
        .into_response()
}

pub fn created(id: i64, replayed: bool, echo: Option<&str>) -> Response {
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

pub async fn fixture_post(
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
    let key = match fixture_key(&headers) {
        Ok(key) => key,
        Err(KeyProblem::Missing) => {
            return problem(StatusCode::BAD_REQUEST, "idempotency-key-missing");
        }
        Err(KeyProblem::Invalid) => {
            return problem(StatusCode::BAD_REQUEST, "idempotency-key-invalid");
        }
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

pub async fn fixture_count(State(fixture): State<Arc<Fixture>>) -> axum::Json<Value> {
    if fixture.behaviour.conflicts.is_some() {
        fixture.conflicts.send_replace(0);
        fixture.hold_next.store(true, Ordering::SeqCst);
    }
    axum::Json(json!({ "count": fixture.executions.load(Ordering::SeqCst) }))
}

/// A fixture on a free port: `POST /a`, `POST /b`, `GET /count`. Returns its base URL.
pub async fn spawn_fixture(behaviour: Behaviour, burst: usize) -> String {
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
pub fn fixture_config(base: &str, burst: usize) -> CheckConfig {
    let mut config = CheckConfig::new(url(&format!("{base}/a")))
        .body(r#"{"amount":10}"#)
        .other_url(url(&format!("{base}/b")))
        .probe(url(&format!("{base}/count")));
    config.concurrency = burst;
    config
}

/// Why a fixture refuses a request's key.
pub enum KeyProblem {
    /// No `Idempotency-Key`.
    Missing,
    /// Two of them, an empty one, one over 255 characters, or one with other than visible
    /// ASCII (a quoted key, `"k"`, counts without its quotes).
    Invalid,
}

/// The fixtures' own reading of the key (not oncely's: the checker is tested against servers
/// it does not share code with).
pub fn fixture_key(headers: &HeaderMap) -> Result<String, KeyProblem> {
    let mut values = headers.get_all("idempotency-key").iter();
    let value = values.next().ok_or(KeyProblem::Missing)?;
    if values.next().is_some() {
        return Err(KeyProblem::Invalid);
    }
    let text = value.to_str().map_err(|_| KeyProblem::Invalid)?;
    let key = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(KeyProblem::Invalid);
    }
    Ok(key.to_owned())
}
