//! Logs, request ids and metrics.
//!
//! - Logs: human-readable in development, JSON in production; every line of a request carries
//!   its `request_id` (the `x-request-id` header, generated if absent and echoed back), method
//!   and path, and the idempotency layer adds `idempotency_outcome` and `route`. Addresses appear
//!   only masked (`a***@example.com`); tokens never.
//! - Metrics (`GET /metrics`, Prometheus text):
//!   - `oncely_http_requests_total{route, method, status}`, `oncely_http_request_duration_seconds{route}`;
//!   - `oncely_idempotency_requests_total{route, outcome}` (created, replayed, in_progress,
//!     mismatch, invalid, released, error);
//!   - `oncely_outbox_pending`, `oncely_outbox_oldest_pending_seconds` (read at scrape time);
//!   - `oncely_outbox_attempts_total{kind, result}` (sent, retry, unknown, dead, expired, skipped,
//!     throttled, paused);
//!   - `oncely_outbox_kind_paused{kind}` (1 while a worker holds the kind paused: the provider
//!     refused our credentials), `oncely_outbox_refusals_total{kind}`;
//!   - `oncely_emails_suppressed_total{limit}`;
//!   - `oncely_pruned_rows_total{table}`.

use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderName;
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

fn filter() -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Installs the log subscriber on stderr: JSON lines in production, readable text otherwise —
/// coloured only on a terminal (and not under `NO_COLOR`): a pipe or a file gets no escape
/// codes. `RUST_LOG` filters (default `info`).
pub fn init_tracing(json: bool) {
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    if json {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        builder.init();
    }
}

/// Installs the log subscriber writing readable text to `file`: for a command whose own output
/// is the story (`oncely demo`).
pub fn init_tracing_to_file(file: std::fs::File) {
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .init();
}

/// The process's Prometheus recorder (installed on first use; later calls share it).
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (a test harness): then this one stays
        // local and /metrics shows what it saw.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Request ids and one span per request, around the whole router.
pub fn layer(router: axum::Router) -> axum::Router {
    let trace = TraceLayer::new_for_http().make_span_with(|req: &Request| {
        let request_id = req.headers().get(&REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("-");
        tracing::info_span!("request", request_id = %request_id, method = %req.method(), path = %req.uri().path())
    });
    router
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(trace)
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

/// Counts and times requests by route template (a route layer: unmatched paths are not
/// counted, so random URLs cannot blow up the label set).
pub async fn record_http(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default();
    let method = req.method().to_string();
    let started = Instant::now();
    let response = next.run(req).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("oncely_http_requests_total", "route" => route.clone(), "method" => method, "status" => status)
        .increment(1);
    metrics::histogram!("oncely_http_request_duration_seconds", "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}
