//! RFC 9457 problem details: the one place error responses are built.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

/// Where problem types live: `type` is this base followed by a slug.
pub const PROBLEM_BASE: &str = "https://oncely.dev/problems/";

/// The media type of problem details.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem: `type`, `title`, `status`, `detail`.
///
/// ```
/// use oncely::Problem;
/// use http::StatusCode;
/// let p = Problem::new(StatusCode::BAD_REQUEST, "idempotency-key-missing", "Idempotency-Key required")
///     .with_detail("send an Idempotency-Key header");
/// assert_eq!(p.type_uri(), "https://oncely.dev/problems/idempotency-key-missing");
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    type_uri: String,
    title: String,
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    #[serde(skip)]
    retry_after: Option<u64>,
}

impl Problem {
    /// A problem of type `PROBLEM_BASE + slug`.
    pub fn new(status: StatusCode, slug: &str, title: impl Into<String>) -> Self {
        Self {
            type_uri: format!("{PROBLEM_BASE}{slug}"),
            title: title.into(),
            status: status.as_u16(),
            detail: None,
            retry_after: None,
        }
    }

    /// Adds a human-readable explanation of this occurrence.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Adds a `Retry-After` header (seconds).
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// The full `type` URI.
    pub fn type_uri(&self) -> &str {
        &self.type_uri
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self).expect("a problem always serializes");
        let mut response = (self.status(), body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
