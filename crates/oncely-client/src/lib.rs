//! A client for APIs that take an `Idempotency-Key` header, such as oncely's.
//!
//! The rules it follows, so that callers do not have to:
//! - **one key per logical operation**: an [`Operation`] gets its key when it is made (or takes
//!   one the caller stored), and every retry sends that key and the same body, unchanged;
//! - **retry only what may succeed later**: transport errors (the request may or may not have
//!   arrived), `409` (the same key is still being processed), `429`, and `5xx` (oncely stores
//!   nothing for them) — with exponential backoff and full jitter, waiting at least what a
//!   `Retry-After` header asks;
//! - **never retry another `4xx`**: a `422` (the key was used for a different request, or its
//!   result cannot be replayed) or a `400` will not change; it is the final answer;
//! - **say when an answer is a replay**: [`Answer::replayed`] is `true` when the server answered
//!   from its stored result (`Idempotent-Replayed: true`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), oncely_client::Error> {
//! use oncely_client::{Client, Operation};
//!
//! let client = Client::new("http://127.0.0.1:8080".parse().unwrap());
//! let signup = Operation::post("/v1/signup")
//!     .json(&serde_json::json!({"email": "ada@example.com"}))?;
//! // Keep signup.key() with the intent if the caller itself may restart and retry later.
//! let answer = client.send(&signup).await?;
//! println!("{} (replayed: {}, attempts: {})", answer.status, answer.replayed, answer.attempts);
//! # Ok(()) }
//! ```
//!
//! A client made with [`Client::with_endpoints`] sends each attempt to the next of several base
//! URLs (replicas of one API), so that a retry does not wait for a dead process.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use rand::Rng;
use reqwest::Url;
use tokio::time::Instant;

/// The header that carries the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header that marks a replayed answer.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// When to give up, and how long to wait between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: u32,
    /// The first backoff; each next one doubles, up to `max_delay`. The wait is drawn uniformly
    /// from zero to that value (full jitter), so that many clients do not retry in step.
    pub initial_delay: Duration,
    /// The longest backoff (a `Retry-After` may ask for longer, up to `max_retry_after`).
    pub max_delay: Duration,
    /// The longest `Retry-After` honoured; a server asking for more gets this.
    pub max_retry_after: Duration,
    /// No attempt starts after this long from the first.
    pub deadline: Duration,
    /// Each attempt's own timeout (connect, send, read the answer).
    pub attempt_timeout: Duration,
}

impl RetryPolicy {
    /// 8 attempts, 100 ms doubling to 5 s, `Retry-After` up to 30 s, within 2 minutes, 30 s per
    /// attempt.
    pub const DEFAULT: Self = Self {
        max_attempts: 8,
        initial_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(5),
        max_retry_after: Duration::from_secs(30),
        deadline: Duration::from_secs(120),
        attempt_timeout: Duration::from_secs(30),
    };

    /// One attempt, no retries (benchmarks count first answers).
    pub const NONE: Self = Self {
        max_attempts: 1,
        ..Self::DEFAULT
    };

    /// The backoff before attempt `next` (2 for the first retry), before jitter.
    fn ceiling(&self, next: u32) -> Duration {
        let doublings = next.saturating_sub(2).min(30);
        self.initial_delay
            .saturating_mul(1 << doublings)
            .min(self.max_delay)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// One logical operation: method, path, body and the key every attempt sends.
#[derive(Debug, Clone)]
pub struct Operation {
    method: Method,
    path: String,
    key: String,
    body: Option<Bytes>,
    headers: HeaderMap,
}

impl Operation {
    /// An operation with a fresh random key (UUID v4). `path` is joined to the client's base URL.
    pub fn new(method: Method, path: &str) -> Self {
        Self {
            method,
            path: path.to_owned(),
            key: uuid::Uuid::new_v4().to_string(),
            body: None,
            headers: HeaderMap::new(),
        }
    }

    /// `POST path` with a fresh key.
    pub fn post(path: &str) -> Self {
        Self::new(Method::POST, path)
    }

    /// Uses `key` instead of a fresh one: for an operation whose key the caller stored before the
    /// first attempt (so that it survives a restart of the caller).
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// A JSON body, serialized once: every attempt sends the same bytes.
    pub fn json(mut self, body: &impl serde::Serialize) -> Result<Self, Error> {
        self.body = Some(serde_json::to_vec(body).map_err(Error::Body)?.into());
        self.headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Ok(self)
    }

    /// Another header on every attempt (for example `Authorization`).
    pub fn header(mut self, name: http::HeaderName, value: HeaderValue) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// The key every attempt sends.
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// The final answer to an operation: a success, or a `4xx` that retrying cannot change.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
    /// The server answered from its stored result (`Idempotent-Replayed: true`).
    pub replayed: bool,
    /// Attempts it took, this one included.
    pub attempts: u32,
}

impl Answer {
    /// The body as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(Error::Body)
    }

    /// Whether the operation succeeded (`2xx`).
    pub fn is_success(&self) -> bool {
        self.status.is_success()
    }
}

/// Why an operation has no final answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Every attempt allowed ended in a retryable failure; the outcome is unknown. Retrying the
    /// same [`Operation`] later (same key) is safe.
    #[error("no final answer after {attempts} attempts (key {key}); last: {last}")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// The operation's key.
        key: String,
        /// The last failure.
        last: String,
        /// The status of the last answer, if the last failure was an HTTP answer.
        status: Option<StatusCode>,
    },
    /// The body could not be serialized, or an answer's body is not the JSON expected.
    #[error("JSON body: {0}")]
    Body(#[source] serde_json::Error),
    /// The path does not join onto the base URL.
    #[error("bad URL: {0}")]
    Url(String),
    /// A header of the operation is not valid.
    #[error("the key is not a valid header value")]
    Key,
}

/// What one attempt came to, as [`Client::on_attempt`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempted {
    /// The server answered with this status (final or to be retried).
    Answered(StatusCode),
    /// No answer: the connection failed, timed out, or broke before the whole answer arrived.
    NoAnswer,
}

/// A function told of every attempt (see [`Client::on_attempt`]).
type Observer = Arc<dyn Fn(Attempted) + Send + Sync>;

/// Calls an Idempotency-Key API. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    endpoints: Arc<[Url]>,
    next: Arc<AtomicUsize>,
    policy: RetryPolicy,
    observer: Option<Observer>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.endpoints)
            .field("policy", &self.policy)
            .field("observer", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for the API at `base`, with [`RetryPolicy::DEFAULT`].
    pub fn new(base: Url) -> Self {
        Self::with_endpoints(vec![base])
    }

    /// A client that sends each attempt to the next of `bases` in turn.
    ///
    /// # Panics
    /// If `bases` is empty.
    pub fn with_endpoints(bases: Vec<Url>) -> Self {
        assert!(!bases.is_empty(), "a client needs at least one endpoint");
        // reqwest is built without a default TLS crypto provider; use ring unless the process
        // installed one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self {
            http: reqwest::Client::new(),
            endpoints: bases.into(),
            next: Arc::new(AtomicUsize::new(0)),
            policy: RetryPolicy::DEFAULT,
            observer: None,
        }
    }

    /// Calls `observer` after every attempt, retried ones included, with what it came to — for
    /// measuring what a retrying client meets (how many `503`s, how long without a `2xx`).
    pub fn on_attempt(mut self, observer: impl Fn(Attempted) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    fn observe(&self, attempted: Attempted) {
        if let Some(observer) = &self.observer {
            observer(attempted);
        }
    }

    /// Uses `http` for the requests (its own TLS, pool and proxy settings).
    pub fn http_client(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// Uses `policy`.
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sends `op` until it has a final answer or the policy gives up. Every attempt carries the
    /// operation's key and body, unchanged.
    pub async fn send(&self, op: &Operation) -> Result<Answer, Error> {
        let key = HeaderValue::from_str(&op.key).map_err(|_| Error::Key)?;
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let base =
                &self.endpoints[self.next.fetch_add(1, Ordering::Relaxed) % self.endpoints.len()];
            let url = base.join(&op.path).map_err(|e| Error::Url(e.to_string()))?;
            let mut request = self
                .http
                .request(op.method.clone(), url)
                .headers(op.headers.clone())
                .header(IDEMPOTENCY_KEY, key.clone())
                .timeout(self.policy.attempt_timeout);
            if let Some(body) = &op.body {
                request = request.body(body.clone());
            }
            let (failure, retry_after, last_status) = match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    let headers = response.headers().clone();
                    let body = response.bytes().await;
                    self.observe(match body {
                        Ok(_) => Attempted::Answered(status),
                        Err(_) => Attempted::NoAnswer,
                    });
                    match body {
                        Ok(body) if !retryable(status) => {
                            let replayed = headers
                                .get(IDEMPOTENT_REPLAYED)
                                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                            return Ok(Answer {
                                status,
                                headers,
                                body,
                                replayed,
                                attempts: attempt,
                            });
                        }
                        Ok(_) => (
                            format!("HTTP {status}"),
                            retry_after(&headers),
                            Some(status),
                        ),
                        Err(error) => (format!("reading the answer: {error}"), None, None),
                    }
                }
                Err(error) => {
                    self.observe(Attempted::NoAnswer);
                    (describe(&error), None, None)
                }
            };
            let wait = self.wait_before(attempt + 1, retry_after);
            let out_of_time = started.elapsed() + wait >= self.policy.deadline;
            if attempt >= self.policy.max_attempts.max(1) || out_of_time {
                return Err(Error::GaveUp {
                    attempts: attempt,
                    key: op.key.clone(),
                    last: failure,
                    status: last_status,
                });
            }
            tracing::debug!(key = %op.key, attempt, %failure, wait_ms = wait.as_millis() as u64, "retrying");
            tokio::time::sleep(wait).await;
        }
    }

    /// The wait before attempt `next`: full jitter under the backoff ceiling, and at least what
    /// the server asked for (capped).
    fn wait_before(&self, next: u32, retry_after: Option<Duration>) -> Duration {
        let ceiling = self.policy.ceiling(next);
        let jittered = ceiling.mul_f64(rand::rng().random_range(0.0..=1.0));
        match retry_after {
            Some(asked) => jittered.max(asked.min(self.policy.max_retry_after)),
            None => jittered,
        }
    }
}

/// Whether an answer may change on a retry with the same key.
pub fn retryable(status: StatusCode) -> bool {
    status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
        || status.is_server_error()
}

/// `Retry-After` in seconds (the HTTP-date form is not used by Idempotency-Key APIs).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_ceiling() {
        let p = RetryPolicy::DEFAULT;
        assert_eq!(p.ceiling(2), Duration::from_millis(100));
        assert_eq!(p.ceiling(3), Duration::from_millis(200));
        assert_eq!(p.ceiling(6), Duration::from_millis(1600));
        assert_eq!(p.ceiling(40), Duration::from_secs(5));
    }

    #[test]
    fn a_retry_after_is_a_floor_on_the_wait_and_is_capped() {
        let client = Client::new("http://127.0.0.1:1".parse().unwrap());
        for _ in 0..100 {
            let w = client.wait_before(2, Some(Duration::from_secs(1)));
            assert_eq!(w, Duration::from_secs(1), "jitter under 100 ms < 1 s asked");
            let capped = client.wait_before(2, Some(Duration::from_secs(3600)));
            assert_eq!(capped, Duration::from_secs(30));
            assert!(client.wait_before(3, None) <= Duration::from_millis(200));
        }
    }

    #[test]
    fn only_in_progress_throttled_and_server_errors_are_retried() {
        for code in [409, 429, 408, 500, 502, 503, 504] {
            assert!(retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [200, 201, 202, 400, 401, 403, 404, 413, 415, 422] {
            assert!(!retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }
}
