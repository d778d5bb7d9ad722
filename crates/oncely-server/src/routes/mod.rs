//! The HTTP API: `/v1/…` account routes behind the idempotency layer, health and readiness.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{MethodRouter, get, post};
use axum::{Json, Router};
use oncely::{IdempotencyLayer, Problem, ServerSecret};
use serde::de::DeserializeOwned;

use crate::accounts::Accounts;
use crate::email::normalize_json_email;

pub mod consume;
pub mod issue;
pub mod links;
pub mod signup;
pub mod tenant;

/// What handlers share.
pub struct AppState<A: Accounts> {
    /// Account SQL and the key store.
    pub accounts: A,
    /// The outbox store handlers enqueue with (the in-process workers' own: an enqueue on
    /// SQLite wakes them).
    pub jobs: A::Jobs,
    /// Derives tokens.
    pub secret: ServerSecret,
    /// Caps on emails.
    pub limits: issue::MailLimits,
}

impl<A: Accounts> Clone for AppState<A> {
    fn clone(&self) -> Self {
        Self {
            accounts: self.accounts.clone(),
            jobs: self.jobs.clone(),
            secret: self.secret.clone(),
            limits: self.limits,
        }
    }
}

/// Idempotency settings of the `/v1` routes.
#[derive(Debug, Clone, Copy)]
pub struct KeyPolicy {
    /// How long an in-progress key is held.
    pub lease: Duration,
    /// How long results replay.
    pub retention: Duration,
}

/// The account routes.
pub fn v1<A: Accounts>(state: AppState<A>, policy: KeyPolicy) -> Router {
    let keys = IdempotencyLayer::transactional(state.accounts.clone(), state.secret.clone())
        .lease(policy.lease)
        .retention(policy.retention)
        .max_request_body(16 * 1024)
        .normalize_json(Arc::new(normalize_json_email));
    // Per method router: the layers run only for a method the route has, so any other method
    // is a plain 405. Outer layers run first: the tenant is known before the key is scoped.
    let tenant = middleware::from_fn_with_state(state.clone(), tenant::resolve::<A>);
    let guarded = |route: MethodRouter<AppState<A>>| {
        route.route_layer(keys.clone()).route_layer(tenant.clone())
    };
    Router::new()
        .route("/v1/signup", guarded(post(signup::signup::<A>)))
        .route(
            "/v1/verify",
            guarded(get(consume::verify_page).post(consume::verify::<A>)),
        )
        .route("/v1/verification/resend", guarded(post(links::resend::<A>)))
        .route(
            "/v1/password-reset",
            guarded(post(links::password_reset::<A>)),
        )
        .route(
            "/v1/password-reset/confirm",
            guarded(get(consume::reset_page).post(consume::reset_confirm::<A>)),
        )
        .route("/v1/magic-link", guarded(post(links::magic_link::<A>)))
        .route(
            "/v1/magic-link/consume",
            guarded(get(consume::magic_page).post(consume::magic_consume::<A>)),
        )
        .route("/v1/invites", guarded(post(links::invite::<A>)))
        .route(
            "/v1/invites/accept",
            guarded(get(consume::invite_page).post(consume::invite_accept::<A>)),
        )
        .with_state(state)
}

/// `Json<T>` whose rejections are problem+json: 415 without a JSON content type, 413 for a
/// body over the limit, 400 for anything unreadable.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(Self(value)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Send JSON",
            )
            .with_detail("the request needs Content-Type: application/json")),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(Problem::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request-too-large",
                    "Request body too large",
                ))
            }
            Err(rejection) => Err(invalid_request(rejection.body_text())),
        }
    }
}

/// The same answer whether or not the address has an account.
pub fn accepted() -> (StatusCode, Json<serde_json::Value>) {
    (
        StatusCode::ACCEPTED,
        Json(serde_json::json!({
            "status": "accepted",
            "detail": "If this address can be used, an email with the next step is on its way to it."
        })),
    )
}

/// 400 `invalid-request`.
pub fn invalid_request(detail: impl Into<String>) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "invalid-request",
        "Invalid request",
    )
    .with_detail(detail)
}

/// 500 for an unexpected failure; the cause goes to the log, not to the client.
pub fn unexpected(error: anyhow::Error) -> Problem {
    tracing::error!(error = format!("{error:#}"), "request failed");
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal-error",
        "Internal error",
    )
    .with_detail("nothing was changed; retry with the same Idempotency-Key")
}
