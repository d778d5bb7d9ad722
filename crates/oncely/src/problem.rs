//! RFC 9457 problem details: the one place error responses are built.
//!
//! Every problem type the layer answers with is declared once, in [`ProblemType`]: its slug
//! (`type` is [`PROBLEM_BASE`] followed by it), its status, its title and what it means. The
//! layer builds its problems only from it, and an API description can list
//! [`ProblemType::ALL`]:
//!
//! ```
//! use oncely::problem::ProblemType;
//! for kind in ProblemType::ALL {
//!     println!("| `{}` | {} | {} |", kind.slug(), kind.status().as_u16(), kind.description());
//! }
//! ```

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

/// Where problem types live: `type` is this base followed by a slug.
pub const PROBLEM_BASE: &str = "https://oncely.dev/problems/";

/// The media type of problem details.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Declares [`ProblemType`]: one line per type, read by every accessor.
macro_rules! problem_types {
    ($($(#[$doc:meta])* $name:ident = ($slug:literal, $status:ident, $title:literal, $description:literal),)*) => {
        /// A problem type the idempotency layer answers with.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ProblemType {
            $($(#[$doc])* $name,)*
        }

        impl ProblemType {
            /// Every problem type of the layer, in the order of the contract.
            pub const ALL: &'static [ProblemType] = &[$(Self::$name),*];

            /// The slug: the `type` URI is [`PROBLEM_BASE`] followed by it.
            pub const fn slug(self) -> &'static str {
                match self { $(Self::$name => $slug,)* }
            }

            /// The HTTP status answered with it.
            pub const fn status(self) -> StatusCode {
                match self { $(Self::$name => StatusCode::$status,)* }
            }

            /// The `title`: the same for every occurrence of the type (RFC 9457 §3.1.3).
            pub const fn title(self) -> &'static str {
                match self { $(Self::$name => $title,)* }
            }

            /// What the type means, for API documentation.
            pub const fn description(self) -> &'static str {
                match self { $(Self::$name => $description,)* }
            }
        }
    };
}

problem_types! {
    /// The route requires an `Idempotency-Key` header and the request has none.
    KeyMissing = ("idempotency-key-missing", BAD_REQUEST, "Idempotency-Key required",
        "the route needs an Idempotency-Key header"),
    /// The key is empty, too long, not visible ASCII, or sent twice.
    KeyInvalid = ("idempotency-key-invalid", BAD_REQUEST, "Idempotency-Key invalid",
        "the key is empty, too long, not visible ASCII, or sent twice"),
    /// The key was used for a different request.
    KeyReused = ("idempotency-key-reused", UNPROCESSABLE_ENTITY, "Idempotency-Key reused",
        "the key was used for a different request"),
    /// A request with the key is still running.
    KeyInUse = ("idempotency-key-in-use", CONFLICT, "Request in progress",
        "a request with the key is still running; retry after Retry-After"),
    /// The request with the key ran, but its response cannot be replayed.
    KeyUnreplayable = ("idempotency-key-unreplayable", UNPROCESSABLE_ENTITY,
        "The result of this request cannot be replayed",
        "the request ran but its response cannot be replayed: too large to store, or lost"),
    /// The request body is over the layer's limit.
    RequestTooLarge = ("request-too-large", PAYLOAD_TOO_LARGE, "Request body too large",
        "the body is over the limit"),
    /// The request body could not be read.
    RequestBodyUnreadable = ("request-body-unreadable", BAD_REQUEST, "Request body unreadable",
        "the body could not be read"),
    /// The request body did not arrive in time ([`crate::body::Deadline`]).
    RequestBodyTimeout = ("request-body-timeout", REQUEST_TIMEOUT, "Request body too slow",
        "the body did not arrive within the time allowed; send it again, faster"),
    /// The key store failed; nothing ran.
    StorageUnavailable = ("storage-unavailable", SERVICE_UNAVAILABLE, "Service unavailable",
        "the key store failed; nothing ran"),
    /// The database was busy (SQLite's write lock); nothing ran.
    StorageBusy = ("storage-busy", SERVICE_UNAVAILABLE, "Service busy",
        "the database was busy (SQLite's write lock); nothing ran"),
    /// A transactional request ran past its lease and was rolled back.
    RequestTimeout = ("request-timeout", SERVICE_UNAVAILABLE, "Request took too long",
        "the request ran past its lease and was rolled back"),
    /// The commit's outcome is unknown.
    CommitFailed = ("commit-failed", SERVICE_UNAVAILABLE, "Outcome unknown",
        "the outcome is unknown; retry with the same key"),
    /// An unexpected failure; nothing was stored.
    InternalError = ("internal-error", INTERNAL_SERVER_ERROR, "Internal error",
        "an unexpected failure; nothing was stored"),
}

impl ProblemType {
    /// The full `type` URI.
    pub fn type_uri(self) -> String {
        format!("{PROBLEM_BASE}{}", self.slug())
    }

    /// A problem of this type, without detail.
    pub fn problem(self) -> Problem {
        Problem::from(self)
    }
}

impl From<ProblemType> for Problem {
    fn from(kind: ProblemType) -> Self {
        Self::new(kind.status(), kind.slug(), kind.title())
    }
}

/// An RFC 9457 problem: `type`, `title`, `status`, `detail`.
///
/// The layer's own problems come from [`ProblemType`]; [`Problem::new`] builds any other.
///
/// ```
/// use oncely::problem::ProblemType;
/// let p = ProblemType::KeyMissing.problem().with_detail("send an Idempotency-Key header");
/// assert_eq!(p.type_uri(), "https://oncely.dev/problems/idempotency-key-missing");
/// assert_eq!(p.status(), http::StatusCode::BAD_REQUEST);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_its_own_slug_and_an_error_status() {
        let slugs: std::collections::BTreeSet<_> =
            ProblemType::ALL.iter().map(|t| t.slug()).collect();
        assert_eq!(slugs.len(), ProblemType::ALL.len());
        for kind in ProblemType::ALL {
            let problem = kind.problem();
            assert_eq!(problem.type_uri(), kind.type_uri());
            assert_eq!(problem.status(), kind.status());
            assert!(kind.status().is_client_error() || kind.status().is_server_error());
        }
    }
}
