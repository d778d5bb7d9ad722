//! The HTTP API: `/v1/…` account routes behind the idempotency layer, health and readiness.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{MethodRouter, get, post};
use axum::{Json, Router};
use oncely::{IdempotencyLayer, ServerSecret};

use crate::accounts::Accounts;
use crate::email::normalize_json_email;

pub mod email_caps;
pub mod error;
pub mod json_body;
pub mod problem;
pub mod send_link;
pub mod signup;
pub mod tenants;
pub mod use_link;

/// What handlers share.
pub struct AppState<A: Accounts> {
    /// Account SQL and the key store.
    pub accounts: A,
    /// The outbox store the in-process workers use (woken after commits).
    pub jobs: A::Jobs,
    /// Derives tokens.
    pub secret: ServerSecret,
    /// Caps on emails.
    pub limits: email_caps::MailLimits,
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
    let tenant = middleware::from_fn_with_state(state.clone(), tenants::resolve::<A>);
    let wake = middleware::from_fn_with_state(state.clone(), wake_workers::<A>);
    let guarded = |route: MethodRouter<AppState<A>>| {
        route
            .route_layer(keys.clone())
            .route_layer(wake.clone())
            .route_layer(tenant.clone())
    };
    Router::new()
        .route("/v1/signup", guarded(post(signup::signup::<A>)))
        .route(
            "/v1/verify",
            guarded(get(use_link::verify_page).post(use_link::verify::<A>)),
        )
        .route(
            "/v1/verification/resend",
            guarded(post(send_link::resend::<A>)),
        )
        .route(
            "/v1/password-reset",
            guarded(post(send_link::password_reset::<A>)),
        )
        .route(
            "/v1/password-reset/confirm",
            guarded(get(use_link::reset_page).post(use_link::reset_confirm::<A>)),
        )
        .route("/v1/magic-link", guarded(post(send_link::magic_link::<A>)))
        .route(
            "/v1/magic-link/consume",
            guarded(get(use_link::magic_page).post(use_link::magic_consume::<A>)),
        )
        .route("/v1/invites", guarded(post(send_link::invite::<A>)))
        .route(
            "/v1/invites/accept",
            guarded(get(use_link::invite_page).post(use_link::invite_accept::<A>)),
        )
        .with_state(state)
}

/// After a mutating request committed, wake idle workers: on PostgreSQL a coalesced NOTIFY
/// sent outside the request's transaction (workers in every process), on SQLite this process's.
async fn wake_workers<A: Accounts>(
    State(state): State<AppState<A>>,
    req: Request,
    next: Next,
) -> Response {
    let mutating = req.method() == Method::POST;
    let response = next.run(req).await;
    if mutating && response.status().is_success() {
        A::notify_workers(&state.jobs);
    }
    response
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
