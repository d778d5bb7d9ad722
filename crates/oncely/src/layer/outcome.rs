//! What happened to one request: logged, counted and attached to the response.

use std::fmt;

use axum::response::Response;

use crate::Scope;

/// What happened to one request, as logged and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// First request: the handler ran and its result was stored.
    Created,
    /// A stored result was returned; the handler did not run.
    Replayed,
    /// Another request with this key was still running: 409.
    InProgress,
    /// Same key, different request: 422.
    Mismatch,
    /// Missing or malformed key, or an unreadable or oversized request body: 400/413.
    Invalid,
    /// The handler ran but failed (5xx) or rejected the request before any effect
    /// (400/401/403/408/409/413/415/429): nothing stored, the key is free again.
    Released,
    /// The key store failed: 503, nothing stored.
    Error,
}

impl Outcome {
    /// The label used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Replayed => "replayed",
            Self::InProgress => "in_progress",
            Self::Mismatch => "mismatch",
            Self::Invalid => "invalid",
            Self::Released => "released",
            Self::Error => "error",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A response extension a handler sets on its (5xx) answer when its effect may have happened
/// but its real answer is lost — a gateway whose upstream timed out, or dropped the connection,
/// after the request was sent. In generic mode the layer then keeps the key instead of
/// releasing it: the key is tombstoned with the reason, and every retry answers 422
/// `idempotency-key-unreplayable` with it, never a second run. (In transactional mode a 5xx
/// rolls the transaction back, so the key is released as usual.)
///
/// ```
/// use axum::response::IntoResponse;
/// let mut response = http::StatusCode::BAD_GATEWAY.into_response();
/// response
///     .extensions_mut()
///     .insert(oncely::OutcomeUnknown::new("the upstream closed the connection before it answered"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomeUnknown {
    reason: String,
}

impl OutcomeUnknown {
    /// Why the outcome is unknown: it completes "the request was processed, but …" in the
    /// retries' 422, so it reads as a clause ("the upstream timed out after 60 s").
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }

    /// The reason.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// The layer's answer to a request: what happened, and the response.
pub(crate) type Answer = (Outcome, Response);

/// Logs and counts the outcome, and attaches it to the response.
pub(crate) fn finish(
    route: &str,
    scope: Option<&Scope>,
    (outcome, mut response): Answer,
) -> Response {
    metrics::counter!(
        "oncely_idempotency_requests_total",
        "outcome" => outcome.as_str(),
        "route" => route.to_owned()
    )
    .increment(1);
    tracing::info!(
        idempotency_outcome = outcome.as_str(),
        route,
        tenant = scope.map(|s| s.tenant.for_logs()).as_deref(),
        status = response.status().as_u16(),
        "idempotent request"
    );
    response.extensions_mut().insert(outcome);
    response
}
