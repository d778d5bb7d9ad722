//! The HTTP side: a Resend-compatible intake, the read/fault API, and the pages.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, FailedToBufferBody};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::json;
use time::OffsetDateTime;

use crate::page::{self, Options};
use crate::{Faults, Inbox, Intake, Message, Rejection, Verdict, WebhookHeaders, WebhookVerdict};

/// The routes, on an [`Inbox`], with the pages' default [`Options`]: `oncely inbox` serves
/// them at `/`; the server mounts them under `/_dev/inbox` in development
/// ([`router_with`] a feed of suppressed emails).
///
/// A request that would change something (any method but `GET` and `HEAD`) is refused (403)
/// when a browser says it comes from another origin — its `Origin` names another host than the
/// one it was sent to, or `Sec-Fetch-Site` says `cross-site` or `same-site` — so that no other
/// site a developer visits can delete messages, set faults or send mail through the inbox.
/// Clients that are not browsers send neither header and are served as before.
///
/// Against DNS rebinding (a name of the attacker's that resolves to the inbox's address, so
/// that the attacker's page is "same origin" with the inbox), a request is served in full only
/// when its `Host` cannot be rebound: an IP literal (`127.0.0.1:8025`, `[::1]:8025`),
/// `localhost` or a `*.localhost` name. At any other name (`inbox:8025` in a container network)
/// a request that a browser marks (`Origin` or `Sec-Fetch-Site`) is refused (403), and so is
/// everything but the intakes, `POST /emails` and `POST /webhooks/{name}`: a rebound page's
/// same-origin `GET` over plain HTTP carries neither header, so only the intakes, which read
/// nothing out, are served there.
pub fn router(inbox: Inbox) -> Router {
    router_with(inbox, Options::default(), Router::new())
}

/// [`router`], with the pages' `options` and `extra` routes (their state given) behind the same
/// guards.
pub fn router_with(inbox: Inbox, options: Options, extra: Router) -> Router {
    // One message as sent, at most ([`crate::Retention::max_message_bytes`]); a webhook at most
    // axum's default, 2 MiB, and no more than that either.
    let message_limit = inbox.max_message_bytes();
    let webhook_limit = WEBHOOK_MAX_BODY.min(message_limit);
    Router::new()
        .route("/", get(page::list))
        .route("/view/{id}", get(page::view))
        .route("/view/{id}/html", get(page::html))
        .route("/assets/inbox.js", get(page::script))
        .route("/assets/inbox.css", get(page::style))
        .route(
            "/emails",
            post(send_email).layer(DefaultBodyLimit::max(message_limit)),
        )
        .route("/messages", get(list).delete(delete))
        .route("/messages/wait", get(wait))
        .route("/messages/{id}", get(one).delete(delete_one))
        .route("/messages/{id}/raw", get(page::raw))
        .route("/messages/{id}/links", get(links))
        .route("/runs", get(list_runs).post(create_run))
        .route("/runs/{id}", get(one_run).delete(delete_run))
        .route("/stats", get(stats))
        .route("/deliveries/{key}", get(delivery))
        .route("/faults", get(faults).put(set_faults))
        .route("/reset", post(reset))
        .route("/webhooks", get(list_webhooks).delete(delete_webhooks))
        .route(
            "/webhooks/{id}",
            get(one_webhook)
                .post(receive_webhook)
                .layer(DefaultBodyLimit::max(webhook_limit)),
        )
        .route("/webhooks/{id}/secrets", put(set_webhook_secrets))
        .layer(Extension(Arc::new(options)))
        .with_state(inbox)
        .merge(extra)
        .layer(axum::middleware::from_fn(same_origin))
        .layer(axum::middleware::from_fn(no_rebinding))
}

/// The largest webhook body taken (axum's default limit, which the inbox always had), unless
/// the largest message is smaller.
pub const WEBHOOK_MAX_BODY: usize = 2 * 1024 * 1024;

/// Refuses what a page at a rebindable name could ask (see [`router`]).
async fn no_rebinding(request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if host.is_some_and(cannot_be_rebound) {
        return next.run(request).await;
    }
    let headers = request.headers();
    let browser = headers.contains_key("sec-fetch-site") || headers.contains_key(header::ORIGIN);
    let intake = request.method() == Method::POST && is_intake(request.uri().path());
    if browser || !intake {
        return (
            StatusCode::FORBIDDEN,
            "refused: the inbox answers browsers only at localhost or an IP address: DNS rebinding \
             (at another host name it only takes POST /emails and POST /webhooks/{name}; read it \
             at its IP address)",
        )
            .into_response();
    }
    next.run(request).await
}

/// Whether `path` is an intake: `/emails`, or `/webhooks/{name}` (one segment).
fn is_intake(path: &str) -> bool {
    path == "/emails"
        || path
            .strip_prefix("/webhooks/")
            .is_some_and(|name| !name.is_empty() && !name.contains('/'))
}

/// Whether a `Host` (with or without a port) names what no DNS answer can change: an IPv4
/// literal, a bracketed IPv6 literal, `localhost` or a name under `.localhost`.
fn cannot_be_rebound(host: &str) -> bool {
    // The port, if any: digits after the last `:` that follows the host.
    let port_ok = |port: Option<&str>| port.is_none_or(|p| p.parse::<u16>().is_ok());
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').is_some_and(|(ip, after)| {
            let port = (!after.is_empty()).then(|| after.strip_prefix(':').unwrap_or("x"));
            ip.parse::<std::net::Ipv6Addr>().is_ok() && port_ok(port)
        });
    }
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    };
    let name = name.to_ascii_lowercase();
    let label =
        |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    port_ok(port)
        && (name.parse::<std::net::Ipv4Addr>().is_ok()
            || name == "localhost"
            || name
                .strip_suffix(".localhost")
                .is_some_and(|sub| sub.split('.').all(label)))
}

/// Refuses a browser's cross-origin request that would change something (see [`router`]).
async fn same_origin(request: Request, next: Next) -> Response {
    let safe = matches!(*request.method(), Method::GET | Method::HEAD);
    if !safe && cross_origin(request.headers()) {
        return (
            StatusCode::FORBIDDEN,
            "refused: a request from another origin cannot change the inbox (use its own page, or a client that is not a browser)",
        )
            .into_response();
    }
    next.run(request).await
}

/// Whether a browser says the request comes from another origin than the one it was sent to.
fn cross_origin(headers: &HeaderMap) -> bool {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    if matches!(text("sec-fetch-site"), Some("cross-site" | "same-site")) {
        return true;
    }
    let Some(origin) = text(header::ORIGIN.as_str()) else {
        return false;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    match (authority, text(header::HOST.as_str())) {
        (Some(authority), Some(host)) => !authority.eq_ignore_ascii_case(host),
        // `Origin: null` (a sandboxed frame, a file), or no Host to compare with.
        _ => true,
    }
}

/// A Resend `POST /emails` body (the fields the inbox uses).
#[derive(Debug, Deserialize)]
struct SendEmail {
    from: String,
    to: OneOrMany,
    subject: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    html: Option<String>,
    #[serde(default)]
    reply_to: Option<OneOrMany>,
    /// Counted with `to` against [`crate::MAX_RECIPIENTS`]; not kept.
    #[serde(default)]
    cc: Option<OneOrMany>,
    /// Counted with `to` against [`crate::MAX_RECIPIENTS`]; not kept.
    #[serde(default)]
    bcc: Option<OneOrMany>,
    #[serde(default)]
    headers: std::collections::HashMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn len(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Many(many) => many.len(),
        }
    }
}

/// A Resend-style error answer: `{"statusCode", "name", "message"}`.
fn error(status: StatusCode, name: &str, message: &str) -> Response {
    let body = json!({ "statusCode": status.as_u16(), "name": name, "message": message });
    (status, Json(body)).into_response()
}

/// Whether a request says its body is JSON (`application/json`, or `…+json`).
fn says_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .is_some_and(|v| {
            v == "application/json" || (v.starts_with("application/") && v.ends_with("+json"))
        })
}

/// The answer to a message larger than the inbox takes.
fn too_large(inbox: &Inbox) -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "message_too_large",
        &format!(
            "The message is larger than this inbox takes: at most {} bytes as sent, and what it \
             keeps of one message must fit its byte budget (oncely inbox --max-bytes).",
            inbox.max_message_bytes()
        ),
    )
}

/// `POST /emails`: a body over [`Inbox::max_message_bytes`] is refused (413) as soon as it
/// passes the limit (the route's [`DefaultBodyLimit`]), never read in full.
async fn send_email(
    State(inbox): State<Inbox>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Response {
    if !says_json(&headers) {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Expected request with `Content-Type: application/json`",
        )
            .into_response();
    }
    let bytes = match bytes {
        Ok(bytes) => bytes,
        Err(BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_))) => {
            inbox.count_too_large();
            return too_large(&inbox);
        }
        Err(other) => return other.into_response(),
    };
    let body = match Json::<SendEmail>::from_bytes(&bytes) {
        Ok(Json(body)) => body,
        Err(rejection) => return rejection.into_response(),
    };
    let recipients = body.to.len()
        + body.cc.as_ref().map_or(0, OneOrMany::len)
        + body.bcc.as_ref().map_or(0, OneOrMany::len);
    if recipients > crate::MAX_RECIPIENTS {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_error",
            &format!(
                "Too many recipients: {recipients} in `to`, `cc` and `bcc`; this inbox takes at \
                 most {} per email.",
                crate::MAX_RECIPIENTS
            ),
        );
    }
    // Only the header this intake is configured to read (Resend's API: `Idempotency-Key`).
    let key_header = inbox.idempotency_header(Intake::Http);
    let key = headers
        .get(key_header.to_ascii_lowercase())
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let raw = raw_request(&headers, &key_header, &bytes);
    drop(bytes);
    let message = Message {
        id: String::new(),
        intake: Intake::Http,
        received_at: OffsetDateTime::now_utc(),
        from: body.from,
        to: match body.to {
            OneOrMany::One(to) => vec![to],
            OneOrMany::Many(to) => to,
        },
        subject: body.subject,
        text: body.text.unwrap_or_default(),
        html: body.html,
        reply_to: body.reply_to.map(|r| match r {
            OneOrMany::One(r) => r,
            OneOrMany::Many(r) => r.join(", "),
        }),
        message_id: body.headers.get("Message-ID").cloned(),
        idempotency_key: key,
        raw,
    };
    match inbox.attempt(message).await {
        Verdict::Accepted(id) => Json(json!({ "id": id })).into_response(),
        Verdict::AcceptedThenDrop(_) => {
            // Kept, but the client gets no answer: stall until it gives up (its timeout), the
            // way an accepted request whose response is lost looks from outside.
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        Verdict::Rejected(Rejection::Temporary) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "injected_temporary_failure",
            "Temporary failure (injected).",
        ),
        Verdict::Rejected(Rejection::Permanent) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "injected_permanent_failure",
            "Rejected (injected).",
        ),
        Verdict::Throttled(seconds) => {
            let mut answer = error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                "Too many requests (injected).",
            );
            answer
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.into());
            answer
        }
        Verdict::Unauthorized => error(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "API key is invalid (injected).",
        ),
        Verdict::Conflict(conflict) => {
            error(StatusCode::CONFLICT, conflict.name(), conflict.message())
        }
        Verdict::TooLarge => too_large(&inbox),
    }
}

/// The largest `POST /emails` body the raw source shows indented; a larger one is kept as it
/// came: indenting copies it twice more (the parsed document and the text it grows into) while
/// the request is answered, and a large message is read by a program rather than a person.
const INDENTED_UP_TO: usize = 64 * 1024;

/// A `POST /emails` as it came in: the headers the intake reads, then the JSON body
/// (indented, when it parses and is at most [`INDENTED_UP_TO`] bytes; else as it came).
fn raw_request(headers: &HeaderMap, key_header: &str, body: &[u8]) -> String {
    let mut head = String::from("POST /emails\n");
    for name in [header::CONTENT_TYPE.as_str(), key_header] {
        if let Some(value) = headers.get(name.to_ascii_lowercase()) {
            head.push_str(&format!(
                "{name}: {}\n",
                String::from_utf8_lossy(value.as_bytes())
            ));
        }
    }
    head.push('\n');
    if body.len() <= INDENTED_UP_TO
        && let Ok(json) = serde_json::from_slice::<serde_json::Value>(body)
    {
        head.push_str(&serde_json::to_string_pretty(&json).unwrap_or_default());
        return head;
    }
    let body = String::from_utf8_lossy(body);
    let mut raw = String::with_capacity(head.len() + body.len());
    raw.push_str(&head);
    raw.push_str(&body);
    raw
}

/// `GET /messages?to=&run=`.
#[derive(Debug, Deserialize)]
struct ListQuery {
    to: Option<String>,
    run: Option<String>,
}

/// `GET /messages?to=&run=`: the kept copies, oldest first, to `to` and of the run `run`
/// (whichever are given); 404 for a run that does not exist.
async fn list(State(inbox): State<Inbox>, Query(q): Query<ListQuery>) -> Response {
    if let Some(unknown) = unknown_run(&inbox, q.run.as_deref()) {
        return unknown;
    }
    Json(inbox.matching(q.to.as_deref(), q.run.as_deref())).into_response()
}

/// The 404 answer for `run`, if it is given and does not exist.
fn unknown_run(inbox: &Inbox, run: Option<&str>) -> Option<Response> {
    let run = run?;
    inbox.run(run).is_none().then(|| {
        problem(
            StatusCode::NOT_FOUND,
            "Unknown run",
            "unknown_run",
            &format!(
                "there is no run {run:?}: create one with POST /runs (a run is forgotten when it \
                 is deleted, after the inbox's max age, beyond the newest {} runs, or by POST /reset)",
                crate::runs::MAX_RUNS
            ),
        )
    })
}

/// The longest `GET /messages/wait` waits.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// `GET /messages/wait?to=&run=&count=&timeout=`.
#[derive(Debug, Deserialize)]
struct WaitQuery {
    to: Option<String>,
    run: Option<String>,
    count: Option<String>,
    timeout: Option<String>,
}

/// A wait's timeout: a number with a unit, `ms`, `s`, `m` or `h` (`250ms`, `10s`, `1m`), or a bare
/// number of seconds; at most [`MAX_WAIT`].
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let bad = || format!("timeout={text:?}: expected a duration such as 500ms, 10s or 1m");
    let number: u64 = number.parse().map_err(|_| bad())?;
    let timeout = match unit {
        "ms" => Duration::from_millis(number),
        "" | "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.saturating_mul(60)),
        "h" => Duration::from_secs(number.saturating_mul(3600)),
        _ => return Err(bad()),
    };
    if timeout > MAX_WAIT {
        return Err(format!(
            "timeout={text:?}: at most {}s (wait again for longer)",
            MAX_WAIT.as_secs()
        ));
    }
    Ok(timeout)
}

/// `GET /messages/wait?to=&run=&count=N&timeout=10s`: answers as soon as at least `count`
/// (default 1) kept copies are to `to` and of the run `run` (at least one of them given) —
/// 200 `{"complete": true, "count", "wanted", "messages"}` — or, when `timeout` (default 10s,
/// at most 60s) has passed, what there is: 408 with `"complete": false`. A bad parameter is 400
/// and an unknown run 404, each with a problem body saying what to change.
async fn wait(State(inbox): State<Inbox>, Query(q): Query<WaitQuery>) -> Response {
    let bad = |detail: String| {
        problem(
            StatusCode::BAD_REQUEST,
            "Bad wait",
            "invalid_parameter",
            &detail,
        )
    };
    if q.to.is_none() && q.run.is_none() {
        return bad("name what to wait for: to=<address>, run=<run id>, or both".into());
    }
    // An empty `to=` (a shell variable that was not set) matches no address: refused, not a
    // wait that can only time out.
    if q.to.as_deref().is_some_and(|to| to.trim().is_empty()) {
        return bad("to=\"\": an address to wait for (or leave to= out and give run=)".into());
    }
    let wanted = match q.count.as_deref().map(str::parse::<usize>) {
        None => 1,
        Some(Ok(n)) if (1..=10_000).contains(&n) => n,
        Some(_) => {
            return bad(format!(
                "count={:?}: expected a number of messages from 1 to 10000",
                q.count.unwrap_or_default()
            ));
        }
    };
    let timeout = match q.timeout.as_deref().map(parse_timeout) {
        None => Duration::from_secs(10),
        Some(Ok(timeout)) => timeout,
        Some(Err(why)) => return bad(why),
    };
    if let Some(unknown) = unknown_run(&inbox, q.run.as_deref()) {
        return unknown;
    }
    let waited = inbox
        .wait(q.to.as_deref(), q.run.as_deref(), wanted, timeout)
        .await;
    let status = if waited.complete {
        StatusCode::OK
    } else {
        StatusCode::REQUEST_TIMEOUT
    };
    let body = json!({
        "complete": waited.complete,
        "count": waited.messages.len(),
        "wanted": wanted,
        "messages": waited.messages,
    });
    (status, Json(body)).into_response()
}

/// `GET /messages/{id}/links`: the message's links and one-time codes, and what the link
/// scanner did with them ([`crate::Links`]); 404 if there is no such message.
async fn links(State(inbox): State<Inbox>, Path(id): Path<String>) -> Response {
    match inbox.links(&id) {
        Some(links) => Json(links).into_response(),
        None => problem(
            StatusCode::NOT_FOUND,
            "Unknown message",
            "unknown_message",
            "there is no such message (deleted, or beyond the inbox's retention)",
        ),
    }
}

/// `POST /runs`: a new run, 201 with its id, domain and tag ([`crate::Run`]).
async fn create_run(State(inbox): State<Inbox>) -> Response {
    let run = inbox.create_run();
    let location = format!("/runs/{}", run.run);
    let mut answer = (StatusCode::CREATED, Json(run)).into_response();
    if let Ok(location) = axum::http::HeaderValue::from_str(&location) {
        answer.headers_mut().insert(header::LOCATION, location);
    }
    answer
}

/// `GET /runs`: every run, oldest first, each with how many of its messages are kept.
async fn list_runs(State(inbox): State<Inbox>) -> Json<Vec<crate::Run>> {
    Json(inbox.runs())
}

/// `GET /runs/{id}`: the run with how many of its messages are kept, or 404.
async fn one_run(State(inbox): State<Inbox>, Path(id): Path<String>) -> Response {
    match inbox.run(&id) {
        Some(run) => Json(run).into_response(),
        None => {
            unknown_run(&inbox, Some(&id)).unwrap_or_else(|| StatusCode::NOT_FOUND.into_response())
        }
    }
}

/// `DELETE /runs/{id}`: deletes the run and its messages: 200 `{"deleted": n}`, or 404.
async fn delete_run(State(inbox): State<Inbox>, Path(id): Path<String>) -> Response {
    match inbox.delete_run(&id) {
        Some(deleted) => Json(json!({ "run": id, "deleted": deleted })).into_response(),
        None => problem(
            StatusCode::NOT_FOUND,
            "Unknown run",
            "unknown_run",
            &format!("there is no run {id:?} (already deleted, or forgotten)"),
        ),
    }
}

/// `GET /deliveries/{key}`: whether a message under this delivery key was accepted
/// ([`Inbox::delivery`]); always 200, `accepted: false` for a key never accepted.
async fn delivery(State(inbox): State<Inbox>, Path(key): Path<String>) -> Json<crate::Delivery> {
    Json(inbox.delivery(&key))
}

async fn one(State(inbox): State<Inbox>, Path(id): Path<String>) -> Response {
    match inbox.message(&id) {
        Some(message) => Json(message).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `DELETE /messages`'s body, as Mailpit takes it: `IDs` in any case (Go's JSON decoder matches
/// field names so), and nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteIds {
    #[serde(
        rename = "IDs",
        alias = "ids",
        alias = "idS",
        alias = "iDs",
        alias = "iDS",
        alias = "Ids",
        alias = "IdS",
        alias = "IDS",
        default
    )]
    ids: Vec<String>,
}

/// `DELETE /messages`: without a body, or with no ids (`{}`, `{"IDs": []}`), every message; with
/// `{"IDs": [...]}` those (unknown ids are ignored). Messages only: the counters and provider
/// mode's keys stay (`POST /reset` forgets them). A body with another field, or not of this
/// shape, is refused (400) and deletes nothing.
async fn delete(State(inbox): State<Inbox>, body: Bytes) -> Response {
    let ids = if body.iter().all(u8::is_ascii_whitespace) {
        Vec::new()
    } else {
        // An object only: serde would also read a struct from an array (`[]`: every message).
        let parsed = serde_json::from_slice::<serde_json::Value>(&body).and_then(|value| {
            if value.is_object() {
                serde_json::from_value::<DeleteIds>(value)
            } else {
                Err(serde::de::Error::custom("not a JSON object"))
            }
        });
        match parsed {
            Ok(body) => body.ids,
            Err(e) => {
                let why = format!("expected {{\"IDs\": [\"<id>\", ...]}}: {e}");
                return (StatusCode::BAD_REQUEST, why).into_response();
            }
        }
    };
    if ids.is_empty() {
        inbox.delete_all();
    } else {
        inbox.delete(&ids);
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /reset` with a JSON body (`{}`): a fresh inbox for the next test ([`Inbox::clear`]):
/// every message, counter, provider mode's key and accepted delivery key forgotten; the faults stay. Another content
/// type is refused (415): a web page can post a form to a developer's loopback inbox, but not
/// JSON without the browser asking first.
async fn reset(State(inbox): State<Inbox>, headers: HeaderMap) -> StatusCode {
    let json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !json {
        return StatusCode::UNSUPPORTED_MEDIA_TYPE;
    }
    inbox.clear();
    StatusCode::NO_CONTENT
}

/// `DELETE /messages/{id}`: 204, or 404 if there is no such message.
async fn delete_one(State(inbox): State<Inbox>, Path(id): Path<String>) -> StatusCode {
    if inbox.delete(&[id]) == 1 {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    }
}

async fn stats(State(inbox): State<Inbox>) -> Json<crate::Stats> {
    Json(inbox.stats())
}

async fn faults(State(inbox): State<Inbox>) -> Json<Faults> {
    Json(inbox.faults())
}

/// `PUT /faults`: changes the fields the body (a JSON object) names and answers the faults now
/// in force ([`Inbox::merge_faults`]); `{"dedupe_window_ms": null}` turns provider mode off. A
/// body that is not an object of known fields and values is refused (400) and changes nothing.
async fn set_faults(State(inbox): State<Inbox>, body: Bytes) -> Response {
    let merged = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&body)
        .and_then(|patch| inbox.merge_faults(&patch));
    match merged {
        Ok(faults) => Json(faults).into_response(),
        Err(e) => {
            let why = format!("expected a JSON object of the faults to change: {e}");
            (StatusCode::BAD_REQUEST, why).into_response()
        }
    }
}

/// A problem answer (RFC 9457): `application/problem+json`.
fn problem(status: StatusCode, title: &str, problem: &str, detail: &str) -> Response {
    let body = json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "problem": problem,
        "detail": detail,
    });
    let mut answer = (status, body.to_string()).into_response();
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/problem+json"),
    );
    answer
}

/// `POST /webhooks/{name}`: a Standard Webhooks delivery ([`Inbox::receive_webhook`]). 204
/// when accepted (verified, or unverified when the inbox knows no secret of `name`); 401 with a
/// problem body naming what is wrong (`missing_headers`, `invalid_timestamp`,
/// `timestamp_too_old`, `timestamp_too_new`, `no_matching_signature`, `unusable_secret`), the
/// copy kept as invalid; an injected rejection's status (not kept); or, for an accepted copy
/// the faults say to drop, the connection closed without an answer.
async fn receive_webhook(
    State(inbox): State<Inbox>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let text = |name: &str| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let received = WebhookHeaders {
        id: text("webhook-id"),
        timestamp: text("webhook-timestamp"),
        signature: text("webhook-signature"),
    };
    let missing: Vec<&str> = [
        ("webhook-id", &received.id),
        ("webhook-timestamp", &received.timestamp),
        ("webhook-signature", &received.signature),
    ]
    .into_iter()
    .filter(|(_, v)| v.as_deref().is_none_or(str::is_empty))
    .map(|(name, _)| name)
    .collect();
    match inbox.receive_webhook(&name, received, &body).await {
        WebhookVerdict::Accepted(_) => StatusCode::NO_CONTENT.into_response(),
        WebhookVerdict::AcceptedThenDrop(_) => no_answer(),
        WebhookVerdict::Invalid(_, why) => problem(
            StatusCode::UNAUTHORIZED,
            "Invalid webhook signature",
            why.code(),
            &if why == crate::Problem::MissingHeaders {
                format!("missing: {}", missing.join(", "))
            } else {
                why.detail().to_owned()
            },
        ),
        WebhookVerdict::Rejected(status) => {
            let status = StatusCode::from_u16(status)
                .ok()
                .filter(|s| s.is_client_error() || s.is_server_error())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            problem(
                status,
                "Rejected (injected)",
                "injected_rejection",
                "The test inbox was told to reject this delivery.",
            )
        }
    }
}

/// An answer that never comes: its body fails before a byte of it is written, so the server
/// closes the connection without sending the head either (HTTP/1.1 writes the head with the
/// first piece of the body). The status is an error, so that even a server that wrote the head
/// early would not tell the sender its delivery was accepted.
fn no_answer() -> Response {
    let failing = futures::stream::once(async {
        Err::<Bytes, _>(std::io::Error::other(
            "the test inbox drops this connection without an answer (webhook_drop_after_accept)",
        ))
    });
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        axum::body::Body::from_stream(failing),
    )
        .into_response()
}

/// `GET /webhooks?name=&type=`.
#[derive(Debug, Deserialize)]
struct WebhooksQuery {
    name: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
}

/// `GET /webhooks?name=&type=`: the kept copies, newest first (of endpoint `name`, of event
/// `type`, if given).
async fn list_webhooks(
    State(inbox): State<Inbox>,
    Query(query): Query<WebhooksQuery>,
) -> Json<Vec<crate::Webhook>> {
    Json(inbox.webhooks(query.name.as_deref(), query.event_type.as_deref()))
}

/// `GET /webhooks/{id}`: one copy by the inbox's id, or 404.
async fn one_webhook(State(inbox): State<Inbox>, Path(id): Path<String>) -> Response {
    match inbox.webhook(&id) {
        Some(webhook) => Json(webhook).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `DELETE /webhooks`: every webhook copy (the counters and secrets stay).
async fn delete_webhooks(State(inbox): State<Inbox>) -> StatusCode {
    inbox.delete_webhooks();
    StatusCode::NO_CONTENT
}

/// `PUT /webhooks/{name}/secrets` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Secrets {
    secrets: Vec<String>,
}

/// `PUT /webhooks/{name}/secrets` with `{"secrets": ["whsec_…", …]}`: replaces the endpoint's
/// secrets (`[]`: forgets them) and answers 204 — never the secrets. A body of another shape or
/// a secret that is not `whsec_` and base64 is refused (400, without echoing it) and changes
/// nothing.
async fn set_webhook_secrets(
    State(inbox): State<Inbox>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let Ok(Secrets { secrets }) = serde_json::from_slice::<Secrets>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            "expected {\"secrets\": [\"whsec_…\", …]}",
        )
            .into_response();
    };
    match inbox.set_webhook_secrets(&name, &secrets) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::cannot_be_rebound;

    #[test]
    fn only_ip_literals_and_localhost_names_cannot_be_rebound() {
        for host in [
            "127.0.0.1",
            "127.0.0.1:8025",
            "10.0.0.7:80",
            "[::1]",
            "[::1]:8025",
            "localhost",
            "LOCALHOST:3000",
            "app.localhost:8080",
            "a.b.localhost",
        ] {
            assert!(cannot_be_rebound(host), "{host}");
        }
        for host in [
            "evil.test",
            "evil.test:8025",
            "inbox:8025",
            "127.0.0.1.nip.io",
            "localhost.evil.test",
            "evillocalhost",
            ".localhost",
            "a..localhost",
            "127.0.0.1:x",
            "127.0.0.1:99999",
            "[::1]x",
            "[::1",
            "[evil.test]",
            "2130706433",
            "127.1",
            "",
        ] {
            assert!(!cannot_be_rebound(host), "{host}");
        }
    }
}
