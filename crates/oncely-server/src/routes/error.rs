//! [`ApiError`]: what a route answers when it does not succeed — an RFC 9457 problem of one of
//! the types in [`super::problem`]. Handlers return `Result<_, ApiError>` and use `?`: on an
//! `anyhow::Error` (an unexpected failure: logged once with its chain, never shown to the
//! client), on [`TxAborted`] (the layer answers instead) and on a password hasher's error.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use oncely::{Problem, TxAborted};

use super::problem::{LayerProblem, ListedProblem, ServerProblem};
use crate::password;

/// Why a route did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `invalid-request`: what is wrong with the request (for the client to read).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The body is not JSON (415 `unsupported-media-type`) or over the limit (413
    /// `request-too-large`).
    #[error("unreadable body: {0:?}")]
    Body(BodyError),
    /// 400 `token-invalid`: the link does not work (one answer whatever the reason).
    #[error("invalid token")]
    InvalidToken,
    /// 400 `password-mismatch`: not the password the signup chose.
    #[error("not the signup's password")]
    PasswordMismatch,
    /// 400 `return-url-not-allowed`: `return_to` is not one of the tenant's return URLs.
    #[error("return URL not allowed")]
    ReturnUrlNotAllowed,
    /// 400 `code-invalid`: the code does not work (one answer whatever the reason).
    #[error("invalid code")]
    InvalidCode,
    /// 401 `unauthorized`.
    #[error("unauthorized: {0:?}")]
    Unauthorized(Unauthorized),
    /// The idempotency key was not acquired: under the layer the client never sees this
    /// answer (409 `idempotency-key-in-use`); the layer answers from the key's state.
    #[error(transparent)]
    Conflict(#[from] TxAborted),
    /// 503 `busy` with `Retry-After`: every password hasher is busy; nothing ran.
    #[error("password hashers busy")]
    Unavailable,
    /// 503 `storage-unavailable`: the database cannot serve now (unreachable, out of
    /// connections, SQLite's write lock not free in time); nothing was changed.
    #[error("the database cannot serve now")]
    StorageUnavailable,
    /// 404 `not-found`: no route at this path.
    #[error("no such path")]
    NotFound,
    /// 405 `method-not-allowed`: the path takes other methods (the router adds `Allow`).
    #[error("method not allowed")]
    MethodNotAllowed,
    /// 401 `login-failed`: one answer for every failed login (unknown or unparseable address,
    /// wrong password, no password, not verified).
    #[error("login failed")]
    LoginFailed,
    /// 429 `login-throttled` with `Retry-After` (seconds to the end of the window): too many
    /// failed logins; no password was checked.
    #[error("login throttled")]
    LoginThrottled {
        /// Seconds until the window ends.
        retry_after: u64,
    },
    /// 404 `user-not-found`: the user the path names is not the proven tenant's.
    #[error("no such user")]
    UserNotFound,
    /// 500 `internal-error`: logged with its chain; the client learns nothing of it.
    #[error(transparent)]
    Unexpected(anyhow::Error),
}

/// What is wrong with a body, before it is read as the route's JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// No `Content-Type: application/json`.
    NotJson,
    /// Over the route's limit.
    TooLarge,
    /// Not all there by the body deadline (`ONCELY_BODY_READ_TIMEOUT`).
    TimedOut,
}

/// Why a request is not authorized; both are `unauthorized` with `WWW-Authenticate: Bearer`,
/// their titles differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unauthorized {
    /// The `Authorization` header is malformed or names no tenant.
    InvalidKey,
    /// The route needs a tenant's API key and the request sent none.
    KeyRequired,
}

impl ApiError {
    /// 400 `invalid-request` with `detail`.
    pub fn invalid_request(detail: impl Into<String>) -> Self {
        Self::InvalidRequest(detail.into())
    }

    /// The problem this answers. An unexpected error's chain is logged here, once.
    fn into_problem(self) -> Problem {
        match self {
            Self::InvalidRequest(detail) => server(ServerProblem::InvalidRequest).with_detail(detail),
            Self::Body(BodyError::NotJson) => server(ServerProblem::UnsupportedMediaType)
                .with_detail("the request needs Content-Type: application/json"),
            Self::Body(BodyError::TooLarge) => layer(LayerProblem::RequestTooLarge),
            Self::Body(BodyError::TimedOut) => layer(LayerProblem::RequestBodyTimeout)
                .with_detail("the request body did not arrive in time; send it again, faster"),
            Self::InvalidToken => server(ServerProblem::TokenInvalid).with_detail(
                "the link is invalid, was already used, or has expired; request a new one",
            ),
            Self::PasswordMismatch => server(ServerProblem::PasswordMismatch).with_detail(
                "enter the password you chose when you signed up, or confirm without a password and set one later with a password reset",
            ),
            Self::ReturnUrlNotAllowed => server(ServerProblem::ReturnUrlNotAllowed).with_detail(
                "return_to must be exactly one of the tenant's return URLs (oncely tenant set --return-url), or left out",
            ),
            Self::InvalidCode => server(ServerProblem::CodeInvalid).with_detail(
                "the code is invalid, was already used, has expired, or belongs to another tenant",
            ),
            Self::Unauthorized(Unauthorized::InvalidKey) => server(ServerProblem::Unauthorized)
                .with_detail("send Authorization: Bearer <tenant API key>, or no Authorization header for the default tenant"),
            Self::Unauthorized(Unauthorized::KeyRequired) => {
                let unauthorized = ListedProblem::from(ServerProblem::Unauthorized);
                Problem::new(unauthorized.status, unauthorized.slug, "API key required")
                    .with_detail("this route needs Authorization: Bearer <tenant API key>")
            }
            Self::Conflict(aborted) => Problem::from(aborted),
            Self::Unavailable => server(ServerProblem::Busy)
                .with_detail(
                    "nothing was changed; retry with the same Idempotency-Key after Retry-After",
                )
                .with_retry_after(password::RETRY_AFTER_SECONDS),
            Self::StorageUnavailable => layer(LayerProblem::StorageUnavailable)
                .with_detail(
                    "nothing was changed; retry with the same Idempotency-Key after Retry-After",
                )
                .with_retry_after(1),
            Self::NotFound => server(ServerProblem::NotFound)
                .with_detail("see GET /openapi.json for the paths this service answers"),
            Self::MethodNotAllowed => server(ServerProblem::MethodNotAllowed)
                .with_detail("the Allow header lists the methods this path takes"),
            Self::LoginFailed => server(ServerProblem::LoginFailed)
                .with_detail("the email address or the password is wrong, or the address is not verified yet"),
            Self::LoginThrottled { retry_after } => server(ServerProblem::LoginThrottled)
                .with_detail("too many failed logins; try again after Retry-After seconds")
                .with_retry_after(retry_after),
            Self::UserNotFound => server(ServerProblem::UserNotFound)
                .with_detail("no user with this id in the tenant of the API key"),
            Self::Unexpected(error) => {
                tracing::error!(error = format!("{error:#}"), "request failed");
                layer(LayerProblem::InternalError)
                    .with_detail("nothing was changed; retry with the same Idempotency-Key")
            }
        }
    }
}

fn server(problem: ServerProblem) -> Problem {
    ListedProblem::from(problem).problem()
}

fn layer(problem: LayerProblem) -> Problem {
    ListedProblem::from(problem).problem()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // Every 401 names the scheme that would authorize the request (RFC 9110, 15.5.2).
        let challenge = matches!(self, Self::Unauthorized(_) | Self::LoginFailed);
        let mut response = self.into_problem().into_response();
        if challenge {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<password::HashError> for ApiError {
    fn from(error: password::HashError) -> Self {
        match error {
            password::HashError::Overloaded => Self::Unavailable,
            password::HashError::Failed(error) => Self::Unexpected(error),
        }
    }
}

impl From<crate::accounts::AccountError> for ApiError {
    /// A database that cannot serve now is a 503 with `Retry-After` (a loaded SQLite's write
    /// lock, an outage); any other account failure a 500. Either way nothing was changed (the
    /// transaction rolls back; a retry with the same key runs again).
    fn from(error: crate::accounts::AccountError) -> Self {
        match error {
            crate::accounts::AccountError::Unavailable(cause) => {
                tracing::warn!(error = %cause, "the database cannot serve now: 503");
                Self::StorageUnavailable
            }
            error => Self::Unexpected(error.into()),
        }
    }
}

impl From<oncely_outbox::OutboxError> for ApiError {
    fn from(error: oncely_outbox::OutboxError) -> Self {
        anyhow::Error::from(error).into()
    }
}

impl From<anyhow::Error> for ApiError {
    /// A failure whose cause is that the database cannot serve now (a lock not free in time,
    /// its connection gone: [`crate::backend::cannot_serve_now`]) is a 503 with `Retry-After`,
    /// however many layers of context it went through; any other is a 500.
    fn from(error: anyhow::Error) -> Self {
        let cannot_serve = error.chain().any(|cause| {
            cause
                .downcast_ref::<sqlx::Error>()
                .is_some_and(crate::backend::cannot_serve_now)
        });
        if cannot_serve {
            tracing::warn!(
                error = format!("{error:#}"),
                "the database cannot serve now: 503"
            );
            Self::StorageUnavailable
        } else {
            Self::Unexpected(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// One of each kind of error. The match makes a new variant fail to compile here until it
    /// is added to the list.
    fn one_of_each() -> Vec<ApiError> {
        let all = vec![
            ApiError::invalid_request("x"),
            ApiError::Body(BodyError::NotJson),
            ApiError::Body(BodyError::TooLarge),
            ApiError::Body(BodyError::TimedOut),
            ApiError::InvalidToken,
            ApiError::PasswordMismatch,
            ApiError::ReturnUrlNotAllowed,
            ApiError::InvalidCode,
            ApiError::Unauthorized(Unauthorized::InvalidKey),
            ApiError::Unauthorized(Unauthorized::KeyRequired),
            ApiError::Conflict(TxAborted),
            ApiError::Unavailable,
            ApiError::StorageUnavailable,
            ApiError::NotFound,
            ApiError::MethodNotAllowed,
            ApiError::LoginFailed,
            ApiError::LoginThrottled { retry_after: 1 },
            ApiError::UserNotFound,
            ApiError::Unexpected(anyhow::anyhow!("x")),
        ];
        for error in &all {
            match error {
                ApiError::InvalidRequest(_)
                | ApiError::Body(BodyError::NotJson | BodyError::TooLarge | BodyError::TimedOut)
                | ApiError::InvalidToken
                | ApiError::PasswordMismatch
                | ApiError::ReturnUrlNotAllowed
                | ApiError::InvalidCode
                | ApiError::Unauthorized(Unauthorized::InvalidKey | Unauthorized::KeyRequired)
                | ApiError::Conflict(_)
                | ApiError::Unavailable
                | ApiError::StorageUnavailable
                | ApiError::NotFound
                | ApiError::MethodNotAllowed
                | ApiError::LoginFailed
                | ApiError::LoginThrottled { .. }
                | ApiError::UserNotFound
                | ApiError::Unexpected(_) => {}
            }
        }
        all
    }

    /// Review of issue 20 (F2): a database that cannot serve now is a 503 whatever context
    /// its error went through on the way (the email caps, the outbox); any other failure, a 500.
    #[test]
    fn a_database_that_cannot_serve_now_is_a_503_through_any_context() {
        use anyhow::Context;
        let wrapped = |error: sqlx::Error| {
            Err::<(), _>(oncely_outbox::OutboxError::Database(error))
                .context("enqueueing the email")
                .unwrap_err()
        };
        for gone in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()),
        ] {
            let error = ApiError::from(wrapped(gone));
            assert!(matches!(error, ApiError::StorageUnavailable), "{error:?}");
        }
        let failed = ApiError::from(wrapped(sqlx::Error::RowNotFound));
        assert!(matches!(failed, ApiError::Unexpected(_)), "{failed:?}");
        let outbox = ApiError::from(oncely_outbox::OutboxError::Database(
            sqlx::Error::PoolTimedOut,
        ));
        assert!(matches!(outbox, ApiError::StorageUnavailable), "{outbox:?}");
    }

    fn slug_of(problem: &Problem) -> String {
        problem
            .type_uri()
            .strip_prefix(oncely::problem::PROBLEM_BASE)
            .unwrap()
            .to_owned()
    }

    #[test]
    fn every_server_problem_type_is_answered_and_every_answer_is_listed() {
        let answered: BTreeSet<String> = one_of_each()
            .into_iter()
            .map(|error| slug_of(&error.into_problem()))
            .collect();
        let listed: BTreeSet<String> = super::super::problem::all()
            .map(|p| p.slug.to_owned())
            .collect();
        assert!(answered.is_subset(&listed), "{answered:?} ⊄ {listed:?}");
        for problem in ServerProblem::ALL {
            assert!(
                answered.contains(problem.slug()),
                "{problem:?} is never answered"
            );
        }
    }

    /// Regression: a route that needs an API key answered 401 without `WWW-Authenticate`, which
    /// every 401 must carry (RFC 9110, 15.5.2); only an invalid key's 401 had it.
    #[test]
    fn every_401_challenges_for_a_bearer_key() {
        for error in one_of_each() {
            let response = error.into_response();
            let challenge = response.headers().get(header::WWW_AUTHENTICATE);
            match response.status().as_u16() {
                401 => assert_eq!(challenge.unwrap(), "Bearer"),
                _ => assert!(challenge.is_none()),
            }
        }
    }

    #[test]
    fn each_answer_has_its_types_status() {
        for error in one_of_each() {
            let problem = error.into_problem();
            let listed = super::super::problem::all()
                .find(|p| p.slug == slug_of(&problem))
                .unwrap();
            assert_eq!(problem.status(), listed.status, "{}", listed.slug);
        }
    }
}
