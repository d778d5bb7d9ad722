//! `oncely check URL`: runs the Idempotency-Key contract (DESIGN's table, docs/check.md)
//! against any HTTP API and reports each row as pass, fail or n/a with its evidence.
//!
//! Every row sends its own fresh key (`oncely-check-<uuid>`) and its own rendering of the
//! sample body (`{{unique}}` replaced by a fresh random string), so rows do not depend on each
//! other except through the first request: when that does not succeed, the rows that need a
//! stored answer are n/a. Nothing here needs a database; [`run`] is the whole checker, the
//! command line only prints its [`Report`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use serde::Serialize;
use serde_json::Value;
use url::Url;

/// The request header that carries the key.
const KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");
/// The response header that marks a replay.
const REPLAYED_HEADER: &str = "idempotent-replayed";
/// The placeholder a sample body may contain.
pub const UNIQUE: &str = "{{unique}}";

/// What to check: the route and how to call it.
#[derive(Debug, Clone)]
pub struct CheckConfig {
    /// The idempotent route.
    pub url: Url,
    /// Its method.
    pub method: Method,
    /// The sample body, `{{unique}}` replaced per row; `None`: no body.
    pub body: Option<String>,
    /// Headers sent with every request (and the probe), e.g. `Authorization`.
    pub headers: Vec<Header>,
    /// Another idempotent route, for the key-per-route row.
    pub other_url: Option<Url>,
    /// The body for `other_url`; `None`: the sample body.
    pub other_body: Option<String>,
    /// A GET whose body counts the operation's executions.
    pub probe: Option<Url>,
    /// Requests sent at once by the concurrent row.
    pub concurrency: usize,
    /// How long one request may take.
    pub timeout: Duration,
}

impl CheckConfig {
    /// `POST url` without a body, no extra headers, 10 requests at once, 10 s per request.
    pub fn new(url: Url) -> Self {
        Self {
            url,
            method: Method::POST,
            body: None,
            headers: Vec::new(),
            other_url: None,
            other_body: None,
            probe: None,
            concurrency: 10,
            timeout: Duration::from_secs(10),
        }
    }

    /// With this sample body.
    pub fn body(mut self, body: impl Into<String>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// With this probe.
    pub fn probe(mut self, probe: Url) -> Self {
        self.probe = Some(probe);
        self
    }

    /// With another route for the key-per-route row.
    pub fn other_url(mut self, other: Url) -> Self {
        self.other_url = Some(other);
        self
    }
}

/// A header the checker sends with every request and the probe (`-H 'Name: value'`). Its
/// value is marked sensitive (Debug does not print it), and never appears in a report.
#[derive(Debug, Clone)]
pub struct Header {
    /// The name.
    pub name: HeaderName,
    /// The value.
    pub value: HeaderValue,
}

impl std::str::FromStr for Header {
    type Err = String;

    /// `Name: value`; refused: no colon, a bad name or value, and `Idempotency-Key` (the
    /// checker sends its own, a fresh one per row).
    fn from_str(text: &str) -> Result<Self, String> {
        let Some((name, value)) = text.split_once(':') else {
            return Err("expected `Name: value` (a colon after the header's name)".into());
        };
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| format!("`{}` is not a header name", name.trim()))?;
        if name == KEY_HEADER {
            return Err("the checker sends its own Idempotency-Key (a fresh one per row)".into());
        }
        let mut value = HeaderValue::from_str(value.trim())
            .map_err(|_| format!("the value of {name} is not a valid header value"))?;
        value.set_sensitive(true);
        Ok(Self { name, value })
    }
}

/// A row's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// The server keeps this part of the contract.
    #[serde(rename = "pass")]
    Pass,
    /// It breaks it: the evidence says how.
    #[serde(rename = "fail")]
    Fail,
    /// It could not be checked: the evidence says why.
    #[serde(rename = "n/a")]
    NotApplicable,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::NotApplicable => "n/a",
        }
    }
}

/// One row of the contract, checked.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Its name (`key-missing`, `replay`, …: docs/check.md).
    pub name: &'static str,
    /// Pass, fail or n/a.
    pub verdict: Verdict,
    /// One line: statuses, header values, short body excerpts.
    pub evidence: String,
}

/// The row names, in the order they run.
pub const ROWS: [&str; 9] = [
    "key-missing",
    "key-malformed",
    "first-request",
    "replay",
    "replay-header",
    "reuse-other-body",
    "key-per-route",
    "concurrent",
    "retry-after",
];

/// Every row of one check.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The method checked.
    pub method: String,
    /// The route checked.
    pub url: String,
    /// Every row, in [`ROWS`] order.
    pub rows: Vec<Row>,
    /// How many rows passed.
    pub passed: usize,
    /// How many failed.
    pub failed: usize,
    /// How many could not be checked.
    pub not_applicable: usize,
    /// Requests answered "busy" (503 or 429 with `Retry-After`) outside the concurrent burst,
    /// and sent again after the wait they asked for.
    pub busy_retries: usize,
}

impl Report {
    fn new(config: &CheckConfig, rows: Vec<Row>, busy_retries: usize) -> Self {
        let count = |v| rows.iter().filter(|r| r.verdict == v).count();
        Self {
            method: config.method.to_string(),
            url: config.url.to_string(),
            passed: count(Verdict::Pass),
            failed: count(Verdict::Fail),
            not_applicable: count(Verdict::NotApplicable),
            busy_retries,
            rows,
        }
    }

    /// The names of the rows that failed.
    pub fn failures(&self) -> Vec<&'static str> {
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::Fail)
            .map(|r| r.name)
            .collect()
    }

    /// The row named `name`.
    pub fn row(&self, name: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.name == name)
    }

    /// The aligned table people read, then a summary line.
    pub fn table(&self) -> String {
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
        let mut out = format!("oncely check: {} {}\n", self.method, self.url);
        let _ = writeln!(out, "{:<width$}  {:<6}  evidence", "row", "result");
        for row in &self.rows {
            let _ = writeln!(
                out,
                "{:<width$}  {:<6}  {}",
                row.name,
                row.verdict.as_str(),
                row.evidence
            );
        }
        let _ = writeln!(
            out,
            "{} rows: {} pass, {} fail, {} n/a{}",
            self.rows.len(),
            self.passed,
            self.failed,
            self.not_applicable,
            match self.busy_retries {
                0 => String::new(),
                n => format!(
                    " ({n} busy answer{} retried after its Retry-After)",
                    if n == 1 { "" } else { "s" }
                ),
            }
        );
        out
    }
}

/// Why the check could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The route does not answer.
    #[error("cannot reach {url}: {reason}")]
    Unreachable {
        /// The route.
        url: String,
        /// What the connection said.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// An answer, read whole.
#[derive(Debug, Clone)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn success(&self) -> bool {
        self.status.is_success()
    }

    fn replayed(&self) -> Option<&str> {
        self.headers
            .get(REPLAYED_HEADER)
            .map(|v| v.to_str().unwrap_or("(not text)"))
    }

    /// Marked as a replay (`Idempotent-Replayed: true`; a server may send `false` on the rest).
    fn is_replay(&self) -> bool {
        self.replayed()
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    }

    /// `201 {"id":1,…}`.
    fn brief(&self) -> String {
        let body = excerpt(&self.body);
        if body.is_empty() {
            self.status.as_u16().to_string()
        } else {
            format!("{} {body}", self.status.as_u16())
        }
    }

    /// The status and, for a problem document, its type: `400 …/idempotency-key-missing`.
    fn status_and_type(&self) -> String {
        let kind = serde_json::from_slice::<Value>(&self.body)
            .ok()
            .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned));
        match kind {
            Some(kind) => format!("{} {kind}", self.status.as_u16()),
            None => self.brief(),
        }
    }
}

/// Which `Idempotency-Key` header lines a request carries.
#[derive(Debug, Clone)]
enum Key {
    None,
    Lines(Vec<HeaderValue>),
}

impl Key {
    /// One fresh key: `oncely-check-<uuid>`.
    fn fresh() -> Self {
        Self::Lines(vec![fresh_key()])
    }
}

fn fresh_key() -> HeaderValue {
    HeaderValue::from_str(&format!("oncely-check-{}", uuid::Uuid::new_v4()))
        .expect("a uuid key is a header value")
}

/// The checker's HTTP side.
struct Client {
    http: reqwest::Client,
    config: CheckConfig,
    json: bool,
    content_type_given: bool,
    secrets: Vec<String>,
    /// How many busy answers [`Client::send`] retried.
    busy_retries: AtomicUsize,
}

impl Client {
    fn new(config: &CheckConfig) -> Result<Self, CheckError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(config.timeout)
            .build()
            .map_err(|e| CheckError::Client(describe(&e)))?;
        let sample = config.body.as_deref().map(|b| b.replace(UNIQUE, "sample"));
        Ok(Self {
            http,
            json: sample.is_some_and(|b| serde_json::from_str::<Value>(&b).is_ok()),
            content_type_given: config.headers.iter().any(|h| h.name == CONTENT_TYPE),
            secrets: secrets(config),
            busy_retries: AtomicUsize::new(0),
            config: config.clone(),
        })
    }

    /// The sample body with a fresh `{{unique}}`.
    fn body(&self) -> Option<String> {
        self.config
            .body
            .as_deref()
            .map(|b| b.replace(UNIQUE, &unique()))
    }

    /// One request as a careful client sends it: an answer that says "busy, come back" (503 or
    /// 429 with `Retry-After` in seconds) is retried after it (at most 5 s), with the same key
    /// and body, up to 4 times — load is not a verdict on the contract. The concurrent burst
    /// uses [`Client::send_once`]: its answers are the evidence.
    async fn send(&self, url: &Url, key: &Key, body: Option<&str>) -> Result<Answer, String> {
        let mut attempts = 1;
        loop {
            let answer = self.send_once(url, key, body).await?;
            let busy = matches!(
                answer.status,
                StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
            );
            let wait = answer
                .headers
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
            match wait {
                Some(seconds) if busy && attempts < 5 => {
                    attempts += 1;
                    self.busy_retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_secs(seconds.min(5))).await;
                }
                _ => return Ok(answer),
            }
        }
    }

    async fn send_once(&self, url: &Url, key: &Key, body: Option<&str>) -> Result<Answer, String> {
        let mut request = self.http.request(self.config.method.clone(), url.clone());
        for header in &self.config.headers {
            request = request.header(header.name.clone(), header.value.clone());
        }
        if self.json && !self.content_type_given && body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        if let Key::Lines(lines) = key {
            let mut headers = HeaderMap::new();
            for line in lines {
                headers.append(KEY_HEADER, line.clone());
            }
            request = request.headers(headers);
        }
        if let Some(body) = body {
            request = request.body(body.to_owned());
        }
        let response = request.send().await.map_err(|e| describe(&e))?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = self.clean(response.bytes().await.map_err(|e| describe(&e))?.to_vec());
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// A body without the caller's header values: a server may echo them, and excerpts of
    /// bodies are printed. (Replays are compared after the same cleaning on both sides.)
    fn clean(&self, body: Vec<u8>) -> Vec<u8> {
        match std::str::from_utf8(&body) {
            Ok(text) if self.secrets.iter().any(|s| text.contains(s.as_str())) => {
                without_secrets(text, &self.secrets).into_bytes()
            }
            _ => body,
        }
    }

    /// The probe's count now.
    async fn probe(&self, probe: &Url) -> Result<BTreeMap<String, i64>, String> {
        let mut request = self.http.get(probe.clone());
        for header in &self.config.headers {
            if header.name != CONTENT_TYPE {
                request = request.header(header.name.clone(), header.value.clone());
            }
        }
        let response = request.send().await.map_err(|e| describe(&e))?;
        let status = response.status();
        let body = self.clean(response.bytes().await.map_err(|e| describe(&e))?.to_vec());
        if !status.is_success() {
            return Err(format!("the probe answered {}", brief(status, &body)));
        }
        counts_in(&body).ok_or_else(|| {
            format!(
                "the probe's body has no count (a number, a JSON object's numbers or a JSON array): {}",
                excerpt(&body)
            )
        })
    }
}

/// Runs every row against the route. Fails only when the route cannot be reached at all (or
/// the client cannot be built); a broken contract is a [`Verdict::Fail`] in the report.
pub async fn run(config: &CheckConfig) -> Result<Report, CheckError> {
    let client = Client::new(config)?;
    let url = &config.url;
    let mut rows = Vec::with_capacity(ROWS.len());
    let row = |name: &'static str, verdict, evidence: String| Row {
        name,
        verdict,
        evidence,
    };

    // key-missing: also the reachability check, before anything else runs.
    let missing = match client.send(url, &Key::None, client.body().as_deref()).await {
        Ok(answer) => answer,
        Err(reason) => {
            return Err(CheckError::Unreachable {
                url: url.to_string(),
                reason,
            });
        }
    };
    rows.push(match missing.status {
        StatusCode::BAD_REQUEST => row("key-missing", Verdict::Pass, missing.status_and_type()),
        _ => row(
            "key-missing",
            Verdict::Fail,
            format!("expected 400, got {}", missing.brief()),
        ),
    });

    rows.push(key_malformed(&client).await);

    // first-request: every row that needs a stored answer depends on it.
    let first_key = Key::fresh();
    let first_body = client.body();
    let first = client.send(url, &first_key, first_body.as_deref()).await;
    let first = match first {
        Ok(answer) if answer.success() && !answer.is_replay() => {
            rows.push(row("first-request", Verdict::Pass, answer.brief()));
            answer
        }
        Ok(answer) if answer.success() => {
            rows.push(row(
                "first-request",
                Verdict::Fail,
                format!(
                    "a fresh key answered as a replay (Idempotent-Replayed: {}): {}",
                    answer.replayed().unwrap_or_default(),
                    answer.brief()
                ),
            ));
            answer
        }
        failed => {
            let why = match failed {
                Ok(answer) => answer.brief(),
                Err(reason) => format!("no answer: {reason}"),
            };
            rows.push(row(
                "first-request",
                Verdict::Fail,
                format!("expected 2xx, got {why}"),
            ));
            for name in &ROWS[3..] {
                rows.push(row(
                    name,
                    Verdict::NotApplicable,
                    format!("the first request failed: {why}"),
                ));
            }
            return Ok(Report::new(
                config,
                redact(config, rows),
                client.busy_retries.load(Ordering::Relaxed),
            ));
        }
    };

    // replay and replay-header: the same key and body again.
    match client.send(url, &first_key, first_body.as_deref()).await {
        Ok(again) => {
            rows.push(replay(&first, &again));
            rows.push(match again.replayed() {
                Some(v) if v.eq_ignore_ascii_case("true") => row(
                    "replay-header",
                    Verdict::Pass,
                    "Idempotent-Replayed: true".into(),
                ),
                Some(v) => row(
                    "replay-header",
                    Verdict::Fail,
                    format!("Idempotent-Replayed: {v} (expected true)"),
                ),
                None => row(
                    "replay-header",
                    Verdict::Fail,
                    format!(
                        "no Idempotent-Replayed header on the replay ({})",
                        again.brief()
                    ),
                ),
            });
        }
        Err(reason) => {
            rows.push(row(
                "replay",
                Verdict::Fail,
                format!("no answer to the retry: {reason}"),
            ));
            rows.push(row(
                "replay-header",
                Verdict::Fail,
                format!("no answer to the retry: {reason}"),
            ));
        }
    }

    rows.push(reuse_other_body(&client).await);
    let replays_marked = rows
        .iter()
        .any(|r| r.name == "replay-header" && r.verdict == Verdict::Pass);
    rows.push(key_per_route(&client, &first_key, &first, replays_marked).await);
    let (concurrent, retry_after) = concurrent(&client).await;
    rows.push(concurrent);
    rows.push(retry_after);
    Ok(Report::new(
        config,
        redact(config, rows),
        client.busy_retries.load(Ordering::Relaxed),
    ))
}

/// The values of the headers the caller gave, and of each their credential (`Bearer <this>`):
/// never printed.
fn secrets(config: &CheckConfig) -> Vec<String> {
    let mut secrets: Vec<String> = Vec::new();
    for value in config.headers.iter().filter_map(|h| h.value.to_str().ok()) {
        secrets.push(value.to_owned());
        if let Some((_, credential)) = value.rsplit_once(' ') {
            secrets.push(credential.to_owned());
        }
    }
    secrets.retain(|s| s.len() >= 4);
    // The longest first: a whole value before its credential.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
}

/// `text` without any of `secrets`.
fn without_secrets(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_owned();
    for secret in secrets {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), "[redacted]");
        }
    }
    text
}

/// Rows whose evidence never shows a header value the caller gave (bodies are cleaned as they
/// arrive; this is the last pass over everything printed).
fn redact(config: &CheckConfig, mut rows: Vec<Row>) -> Vec<Row> {
    let secrets = secrets(config);
    for row in &mut rows {
        row.evidence = without_secrets(&row.evidence, &secrets);
    }
    rows
}

async fn key_malformed(client: &Client) -> Row {
    let valid = |s: &str| HeaderValue::from_str(s).expect("a valid header value");
    let non_ascii = format!("oncely-check-é-{}", uuid::Uuid::new_v4());
    let variants = [
        ("empty \"\"", vec![valid("\"\"")]),
        ("300 chars", vec![valid(&"k".repeat(300))]),
        (
            "non-ASCII",
            vec![HeaderValue::from_bytes(non_ascii.as_bytes()).expect("obs-text is allowed")],
        ),
        ("two headers", vec![fresh_key(), fresh_key()]),
    ];
    let mut evidence = Vec::new();
    let mut all_400 = true;
    for (what, lines) in variants {
        let answer = client
            .send(
                &client.config.url,
                &Key::Lines(lines),
                client.body().as_deref(),
            )
            .await;
        match answer {
            Ok(answer) if answer.status == StatusCode::BAD_REQUEST => {
                evidence.push(format!("{what}: 400"));
            }
            Ok(answer) => {
                all_400 = false;
                evidence.push(format!("{what}: {} (expected 400)", answer.brief()));
            }
            Err(reason) => {
                all_400 = false;
                evidence.push(format!("{what}: no answer ({reason})"));
            }
        }
    }
    Row {
        name: "key-malformed",
        verdict: if all_400 {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        evidence: evidence.join("; "),
    }
}

fn replay(first: &Answer, again: &Answer) -> Row {
    let mut problems = Vec::new();
    if again.status != first.status {
        problems.push(format!(
            "status {} (first: {})",
            again.status.as_u16(),
            first.status.as_u16()
        ));
    }
    if again.body != first.body {
        problems.push(format!(
            "body {} (first: {})",
            quoted(&again.body),
            quoted(&first.body)
        ));
    }
    if let Some(kind) = first.headers.get(CONTENT_TYPE)
        && again.headers.get(CONTENT_TYPE) != Some(kind)
    {
        problems.push(format!(
            "Content-Type {:?} (first: {:?})",
            again.headers.get(CONTENT_TYPE),
            kind
        ));
    }
    if problems.is_empty() {
        Row {
            name: "replay",
            verdict: Verdict::Pass,
            evidence: format!("same status and body bytes: {}", again.brief()),
        }
    } else {
        Row {
            name: "replay",
            verdict: Verdict::Fail,
            evidence: format!("the retry differs: {}", problems.join("; ")),
        }
    }
}

async fn reuse_other_body(client: &Client) -> Row {
    let na = |evidence: String| Row {
        name: "reuse-other-body",
        verdict: Verdict::NotApplicable,
        evidence,
    };
    let Some(template) = client.config.body.as_deref() else {
        return na("no sample body to vary (give --body)".into());
    };
    let unique_now = unique();
    let body = template.replace(UNIQUE, &unique_now);
    let Some((other, how)) = other_body(template, &body) else {
        return na("the sample body is empty: nothing to vary".into());
    };
    let key = Key::fresh();
    match client.send(&client.config.url, &key, Some(&body)).await {
        Ok(answer) if answer.success() => {}
        Ok(answer) => return na(format!("its own first request failed: {}", answer.brief())),
        Err(reason) => return na(format!("its own first request got no answer: {reason}")),
    }
    match client.send(&client.config.url, &key, Some(&other)).await {
        Ok(answer) if answer.status == StatusCode::UNPROCESSABLE_ENTITY => Row {
            name: "reuse-other-body",
            verdict: Verdict::Pass,
            evidence: format!("{} ({how})", answer.status_and_type()),
        },
        Ok(answer) => Row {
            name: "reuse-other-body",
            verdict: Verdict::Fail,
            evidence: format!(
                "expected 422, got {}{} ({how})",
                answer.brief(),
                answer
                    .replayed()
                    .map(|v| format!(", Idempotent-Replayed: {v}"))
                    .unwrap_or_default()
            ),
        },
        Err(reason) => Row {
            name: "reuse-other-body",
            verdict: Verdict::Fail,
            evidence: format!("no answer ({reason}) ({how})"),
        },
    }
}

async fn key_per_route(client: &Client, key: &Key, first: &Answer, replays_marked: bool) -> Row {
    let Some(other_url) = &client.config.other_url else {
        return Row {
            name: "key-per-route",
            verdict: Verdict::NotApplicable,
            evidence: "no --other-url given".into(),
        };
    };
    let body = match &client.config.other_body {
        Some(body) => Some(body.replace(UNIQUE, &unique())),
        None => client.body(),
    };
    let answer = match client.send(other_url, key, body.as_deref()).await {
        Ok(answer) => answer,
        Err(reason) => {
            return Row {
                name: "key-per-route",
                verdict: Verdict::Fail,
                evidence: format!("no answer from {other_url}: {reason}"),
            };
        }
    };
    // A server that marks its replays (the replay-header row passed) is believed; one that
    // does not can only be caught by the answer itself (two routes that answer the same
    // constant body then look like a replay: the evidence says so).
    let same = answer.status == first.status && answer.body == first.body;
    let stored = answer.is_replay() || (!replays_marked && same);
    let reused = answer.status == StatusCode::UNPROCESSABLE_ENTITY
        && String::from_utf8_lossy(&answer.body)
            .to_ascii_lowercase()
            .contains("idempotency");
    let (verdict, evidence) = if stored {
        (
            Verdict::Fail,
            format!(
                "the other route answered the first route's stored answer: {}{}",
                answer.brief(),
                if answer.is_replay() {
                    ", Idempotent-Replayed: true".to_owned()
                } else {
                    " (the same status and body; the server marks no replays)".to_owned()
                }
            ),
        )
    } else if reused {
        (
            Verdict::Fail,
            format!(
                "the other route refused the key as reused ({}): keys must be scoped by route",
                answer.status_and_type()
            ),
        )
    } else if answer.success() {
        (
            Verdict::Pass,
            format!(
                "the first route's key ran on the other route: {}, not a replay of the stored {}",
                answer.brief(),
                first.status.as_u16()
            ),
        )
    } else {
        (
            Verdict::NotApplicable,
            format!(
                "the other route did not accept the request: {} (give --other-body)",
                answer.brief()
            ),
        )
    };
    Row {
        name: "key-per-route",
        verdict,
        evidence,
    }
}

/// The concurrent row and the retry-after row (from the same burst).
async fn concurrent(client: &Client) -> (Row, Row) {
    let n = client.config.concurrency;
    let key = Key::fresh();
    let body = client.body();
    let before = match &client.config.probe {
        Some(probe) => Some(client.probe(probe).await),
        None => None,
    };
    let burst = futures::future::join_all(
        (0..n).map(|_| client.send_once(&client.config.url, &key, body.as_deref())),
    )
    .await;
    // Then the retry a client makes once the burst is over (after any Retry-After): it must get
    // the one result too — and if every request of the burst was refused as busy, it is the
    // one execution.
    let retry = client.send(&client.config.url, &key, body.as_deref()).await;
    let after = match (&client.config.probe, &before) {
        (Some(probe), Some(Ok(_))) => Some(client.probe(probe).await),
        _ => None,
    };

    let answers: Vec<&Answer> = burst.iter().filter_map(|a| a.as_ref().ok()).collect();
    let errors: Vec<&String> = burst.iter().filter_map(|a| a.as_ref().err()).collect();
    let statuses = tally(&burst);
    let successes: Vec<&Answer> = answers.iter().copied().filter(|a| a.success()).collect();
    let mut bodies: Vec<&Vec<u8>> = successes.iter().map(|a| &a.body).collect();
    if let Ok(retry) = &retry
        && retry.success()
    {
        bodies.push(&retry.body);
    }
    bodies.sort();
    bodies.dedup();

    let mut problems = Vec::new();
    let retried = match &retry {
        Ok(answer) if answer.success() => format!(
            "the retry after it: {}{}",
            answer.status.as_u16(),
            if answer.is_replay() {
                " (replayed)"
            } else {
                ""
            }
        ),
        Ok(answer) => {
            problems.push(format!("the retry after it answered {}", answer.brief()));
            format!("the retry after it: {}", answer.status.as_u16())
        }
        Err(reason) => {
            problems.push(format!("the retry after it got no answer ({reason})"));
            "the retry after it: no answer".to_owned()
        }
    };
    if successes.is_empty() && !retry.as_ref().is_ok_and(Answer::success) {
        problems.push("no request succeeded".to_owned());
    }
    if bodies.len() > 1 {
        problems.push(format!(
            "{} different success bodies (e.g. {} and {})",
            bodies.len(),
            quoted(bodies[0]),
            quoted(bodies[1])
        ));
    }
    let how = match (before, after) {
        (Some(Ok(before)), Some(Ok(after))) => match executions(&before, &after) {
            Some((executions, readings)) => {
                if executions == 1 {
                    format!("probe {readings}")
                } else {
                    problems.push(format!(
                        "the probe counted {executions} executions ({readings}), expected exactly 1"
                    ));
                    String::new()
                }
            }
            None => "compared answers only (the probe's counts changed names)".to_owned(),
        },
        (Some(Err(why)), _) | (_, Some(Err(why))) => {
            format!("compared answers only ({why})")
        }
        _ => "compared answers (no --probe)".to_owned(),
    };
    // What the requests that did not succeed said (one example): a duplicate refused as in
    // progress, a busy database, …
    let refused = answers
        .iter()
        .find(|a| !a.success())
        .map(|a| format!("; e.g. {}", a.status_and_type()))
        .unwrap_or_default();
    let concurrent = Row {
        name: "concurrent",
        verdict: if problems.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        evidence: if problems.is_empty() {
            format!(
                "{n} at once with one key: {statuses}{refused}; {retried}; every success body identical; {how}"
            )
        } else {
            let how = if how.is_empty() {
                String::new()
            } else {
                format!("; {how}")
            };
            format!(
                "{n} at once with one key: {statuses}{refused}; {retried}; {}{how}",
                problems.join("; ")
            )
        },
    };

    // Answers that tell the client to come back: 409 (the key in progress) and 503 (busy).
    let retry_later: Vec<&Answer> = answers
        .iter()
        .copied()
        .filter(|a| {
            matches!(
                a.status,
                StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE
            )
        })
        .collect();
    let without: Vec<&&Answer> = retry_later
        .iter()
        .filter(|a| a.headers.get(RETRY_AFTER).is_none())
        .collect();
    let retry_after = if retry_later.is_empty() {
        Row {
            name: "retry-after",
            verdict: Verdict::NotApplicable,
            evidence: format!(
                "no 409 or 503 in the burst of {n} ({statuses}): the server finished or waited{}",
                if errors.is_empty() {
                    String::new()
                } else {
                    format!("; {} without an answer", errors.len())
                }
            ),
        }
    } else if without.is_empty() {
        let mut values: Vec<&str> = retry_later
            .iter()
            .filter_map(|a| a.headers.get(RETRY_AFTER)?.to_str().ok())
            .collect();
        values.sort_unstable();
        values.dedup();
        Row {
            name: "retry-after",
            verdict: Verdict::Pass,
            evidence: format!(
                "{} with Retry-After ({})",
                tally_answers(&retry_later),
                values.join(", ")
            ),
        }
    } else {
        Row {
            name: "retry-after",
            verdict: Verdict::Fail,
            evidence: format!(
                "{} of {} without Retry-After (e.g. {})",
                without.len(),
                tally_answers(&retry_later),
                without[0].status_and_type()
            ),
        }
    };
    (concurrent, retry_after)
}

/// `409×3, 503×1`.
fn tally_answers(answers: &[&Answer]) -> String {
    let burst: Vec<Result<Answer, String>> = answers.iter().map(|a| Ok((*a).clone())).collect();
    tally(&burst)
}

/// `201×9, 409×1` (and `no answer×n`).
fn tally(burst: &[Result<Answer, String>]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for answer in burst {
        let label = match answer {
            Ok(a) => a.status.as_u16().to_string(),
            Err(_) => "no answer".to_owned(),
        };
        match counts.iter_mut().find(|(l, _)| *l == label) {
            Some((_, n)) => *n += 1,
            None => counts.push((label, 1)),
        }
    }
    counts.sort();
    counts
        .iter()
        .map(|(l, n)| format!("{l}×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Another request for the same key: the template with another `{{unique}}`; else a JSON
/// object with its first number changed (or a field added), a JSON array with one more
/// element, any other text with `-other` appended. `None` for an empty body. Also says how.
pub fn other_body(template: &str, body: &str) -> Option<(String, String)> {
    if template.contains(UNIQUE) {
        return Some((
            template.replace(UNIQUE, &unique()),
            "other body: another {{unique}}".into(),
        ));
    }
    match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(mut object)) => {
            let number = object
                .iter()
                .find(|(_, v)| v.is_number())
                .map(|(k, v)| (k.clone(), v.clone()));
            let how = match number {
                Some((field, value)) => {
                    let changed = match value.as_i64() {
                        Some(i) => Value::from(i.wrapping_add(1)),
                        None => Value::from(value.as_f64().unwrap_or(0.0) + 1.0),
                    };
                    let how = format!("other body: \"{field}\" {value} → {changed}");
                    object.insert(field, changed);
                    how
                }
                None => {
                    object.insert("oncely_check".into(), Value::from("other-body"));
                    "other body: a field \"oncely_check\" added".into()
                }
            };
            Some((Value::Object(object).to_string(), how))
        }
        Ok(Value::Array(mut items)) => {
            items.push(Value::from("oncely-check-other"));
            Some((
                Value::Array(items).to_string(),
                "other body: one more array element".into(),
            ))
        }
        _ if body.is_empty() => None,
        _ => Some((
            format!("{body}-other"),
            "other body: \"-other\" appended".into(),
        )),
    }
}

/// The counts in a probe's body, by name: a number or `{"count": n}` (the name `""`), a JSON
/// array's length (`length`), else every integer field of a JSON object (`{"rows": 3,
/// "emails": 3}`). `None` when there is none.
pub fn counts_in(body: &[u8]) -> Option<BTreeMap<String, i64>> {
    let text = std::str::from_utf8(body).ok()?.trim();
    let one = |n: i64| Some(BTreeMap::from([(String::new(), n)]));
    if let Ok(n) = text.parse::<i64>() {
        return one(n);
    }
    match serde_json::from_str::<Value>(text).ok()? {
        Value::Number(n) => one(n.as_i64()?),
        Value::Array(items) => Some(BTreeMap::from([(
            "length".to_owned(),
            i64::try_from(items.len()).ok()?,
        )])),
        Value::Object(object) => {
            if let Some(n) = object.get("count").and_then(Value::as_i64) {
                return one(n);
            }
            let counts: BTreeMap<String, i64> = object
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_i64()?)))
                .collect();
            (!counts.is_empty()).then_some(counts)
        }
        _ => None,
    }
}

/// How many times the operation ran between two probe readings: the largest growth of any
/// count (an email counted later than its row grows by 0 for now; a row counted twice by 2).
/// Also the readings for the evidence: `3 → 4`, or `emails 3 → 4, rows 3 → 4`.
fn executions(
    before: &BTreeMap<String, i64>,
    after: &BTreeMap<String, i64>,
) -> Option<(i64, String)> {
    let mut most: Option<i64> = None;
    let mut shown = Vec::new();
    for (name, b) in before {
        let Some(a) = after.get(name) else { continue };
        most = Some(most.map_or(a - b, |m| m.max(a - b)));
        shown.push(if name.is_empty() {
            format!("{b} → {a}")
        } else {
            format!("{name} {b} → {a}")
        });
    }
    Some((most?, shown.join(", ")))
}

/// A fresh string for `{{unique}}`: 16 lower-case hex digits.
fn unique() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..16].to_owned()
}

/// At most 60 characters of a body on one line.
fn excerpt(body: &[u8]) -> String {
    const MAX: usize = 60;
    let text = String::from_utf8_lossy(body);
    let one_line: String = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() > MAX {
        format!("{}…", one_line.chars().take(MAX).collect::<String>())
    } else {
        one_line
    }
}

fn quoted(body: &[u8]) -> String {
    if body.is_empty() {
        "(empty)".into()
    } else {
        excerpt(body)
    }
}

fn brief(status: StatusCode, body: &[u8]) -> String {
    format!("{} {}", status.as_u16(), excerpt(body))
        .trim_end()
        .to_owned()
}

/// A request error in one line: its innermost cause ("Connection refused (os error 111)"),
/// or that it timed out.
fn describe(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return "no answer in time (--timeout)".into();
    }
    let mut innermost: &dyn std::error::Error = error;
    while let Some(source) = innermost.source() {
        innermost = source;
    }
    let text = innermost.to_string();
    if error.is_connect() {
        format!("cannot connect: {text}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_from_a_number_an_object_or_an_array_and_the_largest_growth_is_the_executions()
     {
        let one = |n| Some(BTreeMap::from([(String::new(), n)]));
        assert_eq!(counts_in(b" 7\n"), one(7));
        assert_eq!(counts_in(br#"{"count": 3, "total": 9}"#), one(3));
        assert_eq!(
            counts_in(br#"{"rows": 4, "emails": 3, "name": "x"}"#),
            Some(BTreeMap::from([("emails".into(), 3), ("rows".into(), 4)]))
        );
        assert_eq!(
            counts_in(br#"[{"id":1},{"id":2}]"#),
            Some(BTreeMap::from([("length".into(), 2)]))
        );
        assert_eq!(counts_in(br#"{"name": "x"}"#), None);
        assert_eq!(counts_in(b"<html>"), None);
        let reading =
            |rows, emails| BTreeMap::from([("emails".into(), emails), ("rows".into(), rows)]);
        assert_eq!(
            executions(&reading(3, 3), &reading(4, 3)),
            Some((1, "emails 3 → 3, rows 3 → 4".into()))
        );
        assert_eq!(executions(&reading(3, 3), &reading(5, 4)).unwrap().0, 2);
        assert_eq!(
            executions(&one(2).unwrap(), &one(3).unwrap()),
            Some((1, "2 → 3".into()))
        );
    }

    #[test]
    fn the_other_body_differs_from_the_sample_in_one_place() {
        let (other, _) = other_body(r#"{"amount":10}"#, r#"{"amount":10}"#).unwrap();
        assert_eq!(other, r#"{"amount":11}"#);
        let (other, _) = other_body(r#"{"name":"x"}"#, r#"{"name":"x"}"#).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&other).unwrap(),
            serde_json::json!({"name": "x", "oncely_check": "other-body"})
        );
        let template = r#"{"email":"a-{{unique}}@example.com"}"#;
        let body = template.replace(UNIQUE, "one");
        let (other, _) = other_body(template, &body).unwrap();
        assert_ne!(other, body);
        assert!(other.starts_with(r#"{"email":"a-"#) && !other.contains(UNIQUE));
        assert_eq!(other_body("a=1", "a=1").unwrap().0, "a=1-other");
        assert!(other_body("", "").is_none());
    }

    #[test]
    fn an_excerpt_is_one_short_line() {
        assert_eq!(excerpt(b"{\n  \"a\": 1\n}"), "{ \"a\": 1 }");
        let long = "x".repeat(100);
        assert_eq!(excerpt(long.as_bytes()).chars().count(), 61);
    }
}
