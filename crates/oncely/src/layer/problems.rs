//! The layer's problem answers, each of a [`ProblemType`]: the detail and `Retry-After` of
//! every occurrence, and what it logs.

use axum::response::{IntoResponse, Response};

use super::outcome::{Answer, Outcome};
use crate::KeyError;
use crate::problem::ProblemType;
use crate::store::StoreError;

/// 400: the key is missing or malformed.
pub(crate) fn key_problem(error: &KeyError) -> Answer {
    let problem = match error {
        KeyError::Missing => ProblemType::KeyMissing.problem().with_detail(
            "send an Idempotency-Key header with a unique value per operation, and reuse it on every retry",
        ),
        other => ProblemType::KeyInvalid.problem().with_detail(other.to_string()),
    };
    (Outcome::Invalid, problem.into_response())
}

/// 413, 408 or 400: the request body is over `limit`, did not arrive in time
/// ([`crate::body::Deadline`]), or could not be read.
pub(crate) fn request_body_problem(error: &axum::Error, limit: usize) -> Answer {
    let causes = || std::iter::successors(Some(error as &dyn std::error::Error), |e| e.source());
    let too_large = causes().any(|e| e.is::<http_body_util::LengthLimitError>());
    let too_slow = causes().find_map(|e| e.downcast_ref::<crate::body::BodyTimedOut>());
    let problem = if too_large {
        ProblemType::RequestTooLarge
            .problem()
            .with_detail(format!("the body is larger than {limit} bytes"))
    } else if let Some(timed_out) = too_slow {
        ProblemType::RequestBodyTimeout
            .problem()
            .with_detail(timed_out.to_string())
    } else {
        ProblemType::RequestBodyUnreadable.problem()
    };
    (Outcome::Invalid, problem.into_response())
}

/// 422: the key's row belongs to another request.
pub(crate) fn reused() -> Answer {
    let problem = ProblemType::KeyReused
        .problem()
        .with_detail("this key was used for a different request; use a new key for a new request");
    (Outcome::Mismatch, problem.into_response())
}

/// 422: the request ran, but its result was not stored for replay (`reason`).
pub(crate) fn unreplayable(reason: &str) -> Answer {
    let problem = ProblemType::KeyUnreplayable
        .problem()
        .with_detail(format!("the request was processed, but {reason}"));
    (Outcome::Replayed, problem.into_response())
}

/// 409: a request with this key is still running.
pub(crate) fn in_use() -> Answer {
    let problem = ProblemType::KeyInUse
        .problem()
        .with_detail(
            "a request with this Idempotency-Key is still being processed; retry after a moment",
        )
        .with_retry_after(1);
    (Outcome::InProgress, problem.into_response())
}

/// 503: the key store failed (or its database was busy); nothing ran.
pub(crate) fn store_failed(error: &StoreError) -> Answer {
    let problem = if matches!(error, StoreError::Busy) {
        tracing::warn!(%error, "idempotency key store busy");
        ProblemType::StorageBusy
            .problem()
            .with_detail("the database was busy and the request was not processed; retry with the same Idempotency-Key")
    } else {
        tracing::error!(%error, "idempotency key store failed");
        ProblemType::StorageUnavailable
            .problem()
            .with_detail("the request was not processed; retry with the same Idempotency-Key")
    };
    (Outcome::Error, problem.with_retry_after(1).into_response())
}

/// 503: a transactional handler ran past its lease and was rolled back.
pub(crate) fn request_timeout() -> Response {
    ProblemType::RequestTimeout
        .problem()
        .with_detail("the request ran longer than its lease and was rolled back; retry with the same Idempotency-Key")
        .with_retry_after(1)
        .into_response()
}

/// 503: the commit failed, and may or may not have happened.
pub(crate) fn commit_failed() -> Answer {
    let problem = ProblemType::CommitFailed
        .problem()
        .with_detail("the result could not be confirmed; retry with the same Idempotency-Key")
        .with_retry_after(1);
    (Outcome::Error, problem.into_response())
}

/// 500: the handler ran, but its response body failed before the end; the key is kept (a retry
/// answers 422 `idempotency-key-unreplayable`), never run again.
pub(crate) fn body_failed() -> Response {
    tracing::error!("an idempotent handler's response body failed after it ran");
    ProblemType::InternalError
        .problem()
        .with_detail("the request ran, but its response failed before it was complete; it is not run again: a retry with this Idempotency-Key answers 422")
        .into_response()
}

/// 500: something failed and nothing was stored (`detail` is logged, not sent).
pub(crate) fn internal_error(detail: &str) -> Response {
    tracing::error!(detail, "idempotent request failed");
    ProblemType::InternalError
        .problem()
        .with_detail(
            "the request failed and nothing was stored; retry with the same Idempotency-Key",
        )
        .into_response()
}
