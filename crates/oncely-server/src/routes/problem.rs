//! Every problem type the service answers with, as data: the idempotency layer's (`oncely`'s)
//! and the server's own ([`ServerProblem`]). Handlers build their problems from these (through
//! [`super::error::ApiError`]), `/openapi.json` lists them ([`all`]), and a test checks
//! docs/api.md's table against [`all`].

use axum::http::StatusCode;
use oncely::Problem;

/// The layer's problem types, joined to the server's in [`all`].
pub use oncely::problem::ProblemType as LayerProblem;

/// The problem types the server's routes answer with, beyond the layer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerProblem {
    /// A field is invalid, or the body is not the JSON the route takes.
    InvalidRequest,
    /// The body is not JSON (no `Content-Type: application/json`).
    UnsupportedMediaType,
    /// A link's token does not work: unknown, used, superseded, expired, another flow's or
    /// another tenant's — one answer for all.
    TokenInvalid,
    /// The re-entered password is not the one the signup that sent the link chose.
    PasswordMismatch,
    /// The API key is invalid, or the route needs one.
    Unauthorized,
    /// Every password hasher is busy (or the caller holds its share of them).
    Busy,
    /// A flow request's `return_to` is not one of the tenant's return URLs.
    ReturnUrlNotAllowed,
    /// A code does not work: unknown, used, expired or another tenant's — one answer for all.
    CodeInvalid,
    /// No route at this path.
    NotFound,
    /// The path exists, but not for this method (`Allow` lists the ones it takes).
    MethodNotAllowed,
    /// A login failed: unknown address, wrong password, no password, not verified — one
    /// answer for all.
    LoginFailed,
    /// Too many failed logins for this address or from this client in the window.
    LoginThrottled,
    /// The user the path names is not one of the proven tenant's (unknown, malformed, or
    /// another tenant's: one answer for all).
    UserNotFound,
}

impl ServerProblem {
    /// Every one, in the order documents list them.
    pub const ALL: &[Self] = &[
        Self::InvalidRequest,
        Self::UnsupportedMediaType,
        Self::TokenInvalid,
        Self::PasswordMismatch,
        Self::Unauthorized,
        Self::Busy,
        Self::ReturnUrlNotAllowed,
        Self::CodeInvalid,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::LoginFailed,
        Self::LoginThrottled,
        Self::UserNotFound,
    ];

    /// The last segment of its `type` URI.
    pub const fn slug(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid-request",
            Self::UnsupportedMediaType => "unsupported-media-type",
            Self::TokenInvalid => "token-invalid",
            Self::PasswordMismatch => "password-mismatch",
            Self::Unauthorized => "unauthorized",
            Self::Busy => "busy",
            Self::ReturnUrlNotAllowed => "return-url-not-allowed",
            Self::CodeInvalid => "code-invalid",
            Self::NotFound => "not-found",
            Self::MethodNotAllowed => "method-not-allowed",
            Self::LoginFailed => "login-failed",
            Self::LoginThrottled => "login-throttled",
            Self::UserNotFound => "user-not-found",
        }
    }

    /// Its HTTP status.
    pub const fn status(self) -> StatusCode {
        match self {
            Self::InvalidRequest
            | Self::TokenInvalid
            | Self::PasswordMismatch
            | Self::ReturnUrlNotAllowed
            | Self::CodeInvalid => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Self::NotFound | Self::UserNotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::LoginFailed => StatusCode::UNAUTHORIZED,
            Self::LoginThrottled => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// Its title.
    pub const fn title(self) -> &'static str {
        match self {
            Self::InvalidRequest => "Invalid request",
            Self::UnsupportedMediaType => "Send JSON",
            Self::TokenInvalid => "Invalid or expired link",
            Self::PasswordMismatch => "Not the password chosen at signup",
            // A request without the key a route needs is titled "API key required" (see
            // `ApiError::Unauthorized`).
            Self::Unauthorized => "Invalid API key",
            Self::Busy => "Too many passwords being hashed",
            Self::ReturnUrlNotAllowed => "Return URL not allowed",
            Self::CodeInvalid => "Invalid or expired code",
            Self::NotFound => "No such path",
            Self::MethodNotAllowed => "Method not allowed here",
            Self::LoginFailed => "Wrong email or password",
            Self::LoginThrottled => "Too many failed logins",
            Self::UserNotFound => "No such user in this tenant",
        }
    }

    /// Whether any `POST` under `/v1` may answer it; the others belong to particular routes
    /// (those that take a token or a password).
    pub const fn on_every_post(self) -> bool {
        matches!(
            self,
            Self::InvalidRequest | Self::UnsupportedMediaType | Self::Unauthorized
        )
    }
}

/// A problem type as documents list it: the layer's and the server's alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedProblem {
    /// The last segment of its `type` URI.
    pub slug: &'static str,
    /// Its HTTP status.
    pub status: StatusCode,
    /// Its title.
    pub title: &'static str,
    /// Whether any `POST` under `/v1` may answer it (every one of the layer's may).
    pub on_every_post: bool,
}

impl ListedProblem {
    /// A problem of this type, without detail.
    pub fn problem(self) -> Problem {
        Problem::new(self.status, self.slug, self.title)
    }
}

impl From<LayerProblem> for ListedProblem {
    fn from(problem: LayerProblem) -> Self {
        Self {
            slug: problem.slug(),
            status: problem.status(),
            title: problem.title(),
            on_every_post: true,
        }
    }
}

impl From<ServerProblem> for ListedProblem {
    fn from(problem: ServerProblem) -> Self {
        Self {
            slug: problem.slug(),
            status: problem.status(),
            title: problem.title(),
            on_every_post: problem.on_every_post(),
        }
    }
}

/// Every problem type the service answers with: the layer's, then the server's own.
pub fn all() -> impl Iterator<Item = ListedProblem> {
    let layer = LayerProblem::ALL.iter().map(|&p| ListedProblem::from(p));
    layer.chain(ServerProblem::ALL.iter().map(|&p| ListedProblem::from(p)))
}
