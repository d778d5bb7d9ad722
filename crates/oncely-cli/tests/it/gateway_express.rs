//! `oncely gateway` (the binary) in front of a real Node.js application: the deliberately
//! non-idempotent Express signup of `examples/express-signup`, which inserts a row and "sends"
//! an email (a line in a file) on every call. Without the gateway a storm duplicates both;
//! behind it, one row and one email — through two gateways sharing PostgreSQL, and across a
//! gateway killed with SIGKILL.
//!
//! Needs `node` and the example's npm packages (`scripts/test` runs `npm ci` there); without
//! them each test says SKIPPED and returns.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use oncely_testdb::TestSqlite;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{Process, scalar, spawn_gateway};

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/express-signup")
}

/// The Express example on a free port, with a data directory of its own.
pub struct Express {
    pub base: String,
    data: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl Express {
    /// Started; `None` (after a SKIPPED line naming `test`) without node or its packages.
    pub async fn start(test: &str) -> Option<Self> {
        let dir = example_dir();
        let node = std::process::Command::new("node")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        let packages = ["express", "method-override"];
        if !node
            || !packages
                .iter()
                .all(|p| dir.join("node_modules").join(p).is_dir())
        {
            eprintln!(
                "SKIPPED: node or the npm packages of examples/express-signup are missing (cd examples/express-signup && npm ci); {test} did not run"
            );
            return None;
        }
        let data = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new("node")
            .arg("server.js")
            .current_dir(&dir)
            .env("PORT", "0")
            .env("DATA_DIR", data.path())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("express starts within 30 s")
            .unwrap()
            .expect("express prints its address");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let base = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap()
            .to_owned();
        Some(Self {
            base,
            data,
            _child: child,
        })
    }

    fn lines(&self, file: &str) -> Vec<String> {
        std::fs::read_to_string(self.data.path().join(file))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The rows the application inserted.
    pub fn rows(&self) -> usize {
        self.lines("users.jsonl").len()
    }

    /// The updates of orders it made (each `PUT /orders/:id`, however it was named).
    pub fn order_updates(&self) -> usize {
        self.lines("orders.log").len()
    }

    /// The emails it "sent".
    pub fn emails(&self) -> Vec<String> {
        self.lines("emails.log")
    }
}

/// A signup at `base` with `key`; the status and whether it was a replay.
async fn signup(base: &str, key: &str, body: &str) -> (u16, bool, Value) {
    let response = oncely_testdb::http()
        .post(format!("{base}/signup"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    (
        status,
        replayed,
        response.json().await.unwrap_or(Value::Null),
    )
}

/// 20 retries in a row, then 50 at once, all with one key, alternating between `bases`; every
/// answer's status.
async fn storm(bases: &[&str], key: &str, body: &str) -> Vec<u16> {
    let mut statuses = Vec::new();
    for i in 0..20 {
        statuses.push(signup(bases[i % bases.len()], key, body).await.0);
    }
    let concurrent = futures::future::join_all((0..50).map(|i| {
        let base = bases[i % bases.len()].to_owned();
        async move { signup(&base, key, body).await.0 }
    }))
    .await;
    statuses.extend(concurrent);
    statuses
}

#[tokio::test]
async fn a_storm_duplicates_without_the_gateway_and_runs_once_behind_it() {
    let Some(express) = Express::start("a_storm_duplicates_without_the_gateway…").await else {
        return;
    };
    // Straight to the application: every call is a new account and a new email.
    let body = r#"{"email":"ada@example.com"}"#;
    let direct = storm(&[&express.base], "direct-1", body).await;
    assert!(direct.iter().all(|s| *s == 201));
    assert_eq!(express.rows(), 70);
    assert_eq!(express.emails().len(), 70);

    let db = TestSqlite::new();
    let gateway = spawn_gateway(db.url(), &express.base, &["--route", "POST /signup"]).await;
    let body = r#"{"email":"grace@example.com"}"#;
    let statuses = storm(&[&gateway.base], "signup-grace", body).await;
    assert!(statuses.iter().filter(|s| **s == 201).count() > 1);
    assert!(
        statuses.iter().all(|s| matches!(s, 201 | 409)),
        "{statuses:?}"
    );
    assert_eq!(express.rows(), 71, "one more row");
    let grace: Vec<String> = express
        .emails()
        .into_iter()
        .filter(|l| l.contains("grace@"))
        .collect();
    assert_eq!(grace.len(), 1, "one email: {grace:?}");
    assert!(
        !grace[0].contains("signup-grace"),
        "the application got the derived key: {grace:?}"
    );
    // Other requests pass through to the application.
    let count: Value = oncely_testdb::http()
        .get(format!("{}/count", gateway.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(count["rows"], 71);
}

#[tokio::test]
async fn two_gateways_sharing_postgresql_run_a_storm_once() {
    let Some(express) = Express::start("two_gateways_sharing_postgresql…").await else {
        return;
    };
    let db = crate::support::migrated_postgres().await;
    let route = ["--route", "POST /signup"];
    let a = spawn_gateway(db.url(), &express.base, &route).await;
    let b = spawn_gateway(db.url(), &express.base, &route).await;
    let statuses = storm(
        &[&a.base, &b.base],
        "signup-linus",
        r#"{"email":"linus@example.com"}"#,
    )
    .await;
    assert!(
        statuses.iter().all(|s| matches!(s, 201 | 409)),
        "{statuses:?}"
    );
    assert_eq!(express.rows(), 1);
    assert_eq!(express.emails().len(), 1);
}

/// The state of the one key in a gateway's database.
async fn key_state(url: &str) -> String {
    scalar::<String>(url, "SELECT state FROM oncely_idempotency_keys").await
}

async fn kill(mut gateway: Process) {
    gateway.child.kill().await.unwrap(); // SIGKILL
    gateway.child.wait().await.unwrap();
}

/// Killed with SIGKILL after the upstream answered (and the gateway stored the answer; the
/// client had given up): the retry, to a new process, replays it, and the application ran once.
#[tokio::test]
async fn a_gateway_killed_after_the_upstream_answered_replays_it_after_restart() {
    let Some(express) = Express::start("a_gateway_killed_after_the_upstream_answered…").await
    else {
        return;
    };
    let db = TestSqlite::new();
    let route = ["--route", "POST /signup"];
    let gateway = spawn_gateway(db.url(), &express.base, &route).await;
    let body = r#"{"email":"ken@example.com","delay_ms":600}"#;
    // The client gives up before the application answers.
    let gave_up = oncely_testdb::http()
        .post(format!("{}/signup", gateway.base))
        .header("idempotency-key", "signup-ken")
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_millis(150))
        .send()
        .await;
    assert!(gave_up.is_err(), "the client timed out");
    while key_state(db.url()).await != "completed" {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill(gateway).await;
    let restarted = spawn_gateway(db.url(), &express.base, &route).await;
    let (status, replayed, answer) = signup(&restarted.base, "signup-ken", body).await;
    assert_eq!((status, replayed), (201, true), "{answer}");
    assert_eq!(answer["email"], "ken@example.com");
    assert_eq!(express.rows(), 1);
    assert_eq!(express.emails().len(), 1);
}

/// Killed while the upstream worked: the key stays claimed until its lease ends (a retry gets
/// 409 meanwhile); then a retry takes it over and the upstream runs again — with the same
/// forwarded key, which is what lets an application that records it answer once. The gateway
/// never sends a second, different key for one client key.
#[tokio::test]
async fn a_gateway_killed_before_the_upstream_answered_forwards_the_same_key_again() {
    let Some(express) = Express::start("a_gateway_killed_before_the_upstream_answered…").await
    else {
        return;
    };
    let db = TestSqlite::new();
    let args = ["--route", "POST /signup", "--lease", "5s"];
    let gateway = spawn_gateway(db.url(), &express.base, &args).await;
    let body = r#"{"email":"barbara@example.com","delay_ms":1500}"#;
    let url = format!("{}/signup", gateway.base);
    tokio::spawn(async move {
        let _ = oncely_testdb::http()
            .post(url)
            .header("idempotency-key", "signup-barbara")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await;
    });
    while express.rows() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill(gateway).await;
    let restarted = spawn_gateway(db.url(), &express.base, &args).await;
    let (status, _, _) = signup(&restarted.base, "signup-barbara", body).await;
    assert_eq!(status, 409, "the dead owner's lease still runs");
    let mut answered = 409;
    while answered == 409 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        answered = signup(&restarted.base, "signup-barbara", body).await.0;
    }
    assert_eq!(answered, 201);
    let keys: std::collections::BTreeSet<String> = express
        .emails()
        .iter()
        .map(|l| l.rsplit("key=").next().unwrap().to_owned())
        .collect();
    assert_eq!(keys.len(), 1, "one forwarded key: {keys:?}");
}

/// A POST's query, headers, content type and body.
type Trick<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a [u8]);

/// `_method=PUT`, gzipped.
const GZIPPED_FORM: &[u8] = &[
    31, 139, 8, 0, 0, 0, 0, 0, 2, 3, 139, 207, 77, 45, 201, 200, 79, 177, 13, 8, 13, 1, 0, 255, 16,
    72, 114, 11, 0, 0, 0,
];
/// `{"_method":"PUT"}`, deflated (zlib).
const DEFLATED_JSON: &[u8] = &[
    120, 156, 171, 86, 138, 207, 77, 45, 201, 200, 79, 81, 178, 82, 10, 8, 13, 81, 170, 5, 0, 52,
    217, 5, 148,
];
/// `{"_method":"PUT"}` in UTF-16LE.
const UTF16_JSON: &[u8] = &[
    123, 0, 34, 0, 95, 0, 109, 0, 101, 0, 116, 0, 104, 0, 111, 0, 100, 0, 34, 0, 58, 0, 34, 0, 80,
    0, 85, 0, 84, 0, 34, 0, 125, 0,
];

/// Every way two reviews reached a protected `PUT /orders/{id}` through a POST that Express'
/// `method-override` (and body-parser) turns into a PUT — a header of two values, two
/// different override headers, a percent-escaped `_method` name or value in the query, a form
/// field, qs' `[_method]`, a gzipped or deflated body, a byte order mark, UTF-16, JSON that
/// JavaScript parses and serde does not (a lone surrogate, `1e400`, deep nesting) — does
/// update the order when sent straight to the application, and is refused behind the gateway:
/// the order is never updated unprotected.
#[tokio::test]
async fn method_overrides_express_honours_never_reach_a_protected_route() {
    let Some(express) = Express::start("method_overrides_express_honours…").await else {
        return;
    };
    let form = "application/x-www-form-urlencoded";
    let json = "application/json";
    let deep = format!(
        "{{\"_method\":\"PUT\",\"x\":{}{}}}",
        "[".repeat(200),
        "]".repeat(200)
    );
    let tricks: Vec<Trick> = vec![
        ("", &[("x-http-method-override", "PUT, GET")], json, b"{}"),
        (
            "",
            // The last override the application reads wins; a gateway that read only the
            // first header would see GET.
            &[("x-http-method-override", "GET"), ("x-http-method", "PUT")],
            json,
            b"{}",
        ),
        ("", &[("x-http-method", "put")], json, b"{}"),
        ("?%5Fmethod=PUT", &[], json, b"{}"),
        ("?_method=P%55T", &[], json, b"{}"),
        ("", &[], form, b"note=x&_method=PUT"),
        ("", &[], form, b"%5Fmethod=P%55T"),
        ("", &[], form, b"[_method]=PUT"),
        ("", &[], form, b"%5B_method%5D=PUT"),
        ("", &[("content-encoding", "gzip")], form, GZIPPED_FORM),
        ("", &[("content-encoding", "deflate")], json, DEFLATED_JSON),
        ("", &[], json, b"\xEF\xBB\xBF{\"_method\":\"PUT\"}"),
        ("", &[], "application/json; charset=utf-16le", UTF16_JSON),
        ("", &[], json, br#"{"x":"\ud800","_method":"PUT"}"#),
        ("", &[], json, br#"{"x":1e400,"_method":"PUT"}"#),
        ("", &[], json, deep.as_bytes()),
    ];
    let post = |base: String, (query, headers, content_type, body): Trick| {
        let mut request = oncely_testdb::http()
            .post(format!("{base}/orders/7{query}"))
            .header("content-type", content_type)
            .body(body.to_owned());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        async move {
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    // Straight to the application, each is a PUT: the reproduction is real.
    for (n, trick) in tricks.iter().enumerate() {
        let (status, body) = post(express.base.clone(), *trick).await;
        let trick = (trick.0, trick.1, trick.2, String::from_utf8_lossy(trick.3));
        assert_eq!(status, 200, "{trick:?}: {body}");
        assert_eq!(
            express.order_updates(),
            n + 1,
            "{trick:?} is a PUT to Express"
        );
    }
    let db = TestSqlite::new();
    let gateway = spawn_gateway(db.url(), &express.base, &["--route", "PUT /orders/{id}"]).await;
    for trick in &tricks {
        let (status, body) = post(gateway.base.clone(), *trick).await;
        let trick = (trick.0, trick.1, trick.2, String::from_utf8_lossy(trick.3));
        assert_eq!(status, 400, "{trick:?}: {body}");
        assert!(body.contains("request-ambiguous"), "{trick:?}: {body}");
    }
    assert_eq!(
        express.order_updates(),
        tricks.len(),
        "none reached the application"
    );
    // The PUT itself is protected: retried, it updates the order once.
    let key = "update-order-7";
    for _ in 0..3 {
        let response = oncely_testdb::http()
            .put(format!("{}/orders/7", gateway.base))
            .header("idempotency-key", key)
            .header("content-type", json)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(express.order_updates(), tricks.len() + 1);
}
