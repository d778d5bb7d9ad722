//! The HTTP API: `/v1/…` account routes behind the idempotency layer, health and readiness.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;

use axum::extract::DefaultBodyLimit;
use axum::middleware;

use axum::routing::{MethodRouter, post};
use oncely::{IdempotencyLayer, ReplayCache, ServerSecret};

use crate::accounts::Accounts;
use crate::email::normalize_json_email;
use crate::token::Flow::{EmailChange, Invite, MagicLink, PasswordReset, Verification};
use use_link::page;

// The flows, one module each: their routes, pages and handlers.
pub mod email_change;
pub mod exchange;
pub mod invites;
pub mod login;
pub mod magic_link;
pub mod password_reset;
pub mod signup;
pub mod tenants;
pub mod verification;

// What several flows share.
pub mod account_events;
pub mod error;
pub mod mail_caps;
pub mod new_password;
pub mod post;
pub mod problem;
pub mod send_link;
pub mod use_link;

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
    pub limits: crate::limits::mail::MailLimits,
    /// The per-client email cap, counted in this process.
    pub client_mail: crate::limits::mail::ClientMail,
    /// Caps on failed logins.
    pub login: crate::limits::login::LoginLimits,
    /// Email jobs' payloads name their recipient (`"recipient"`), so that the dev inbox can show
    /// to whom the emails that were not sent would have gone: only while it serves its page
    /// (development, the dev mailer, a loopback address). Otherwise payloads hold ids only.
    pub recipient_in_payload: bool,
    /// The emails' templates: a request's `Accept-Language` is matched against their locales.
    pub templates: crate::templates::Templates,
}

impl<A: Accounts> AppState<A> {
    /// An email job's payload: `payload`, with its recipient when [`AppState::recipient_in_payload`].
    pub fn email_payload(&self, mut payload: serde_json::Value, to: &str) -> serde_json::Value {
        if self.recipient_in_payload {
            payload["recipient"] = serde_json::Value::from(to);
        }
        payload
    }
}

impl<A: Accounts> Clone for AppState<A> {
    fn clone(&self) -> Self {
        Self {
            accounts: self.accounts.clone(),
            jobs: self.jobs.clone(),
            secret: self.secret.clone(),
            limits: self.limits,
            client_mail: self.client_mail.clone(),
            login: self.login,
            recipient_in_payload: self.recipient_in_payload,
            templates: self.templates.clone(),
        }
    }
}

/// The largest request body of every `/v1` route (larger: 413 `request-too-large`, nothing
/// read further, nothing stored) — with a key or without, on every route alike.
pub const MAX_BODY: usize = 16 * 1024;

/// Idempotency settings of the `/v1` routes.
#[derive(Debug, Clone, Copy)]
pub struct KeyPolicy {
    /// How long an in-progress key is held.
    pub lease: Duration,
    /// How long results replay.
    pub retention: Duration,
    /// Bytes of finished keys kept in memory (0: none).
    pub replay_cache_bytes: u64,
}

/// The account routes.
pub fn v1<A: Accounts>(state: AppState<A>, policy: KeyPolicy) -> Router {
    let keys = IdempotencyLayer::transactional(state.accounts.keys().clone(), state.secret.clone())
        .lease(policy.lease)
        .retention(policy.retention)
        .max_request_body(MAX_BODY)
        .normalize_json(Arc::new(normalize_json_email));
    let keys = match policy.replay_cache_bytes {
        0 => keys,
        bytes => keys.replay_cache(&ReplayCache::new(bytes)),
    };
    // Per method router: the layers run only for a method the route has, so any other method
    // is a plain 405. Outer layers run first: the tenant is known before the key is scoped.
    let tenant = middleware::from_fn_with_state(state.clone(), tenants::resolve::<A>);
    let guarded = |route: MethodRouter<AppState<A>>| {
        route.route_layer(keys.clone()).route_layer(tenant.clone())
    };
    // The routes that use links: their stored answer holds a code's id, turned into the
    // redirect outside the layer (for the first answer and every replay alike).
    let codes = middleware::from_fn_with_state(state.clone(), exchange::redirect::<A>);
    let redirecting = |route: MethodRouter<AppState<A>>| {
        route
            .route_layer(keys.clone())
            .route_layer(codes.clone())
            .route_layer(tenant.clone())
    };
    let link_routes = [
        (
            "/v1/verify",
            page(Verification).post(verification::verify::<A>),
        ),
        (
            "/v1/password-reset/confirm",
            page(PasswordReset).post(password_reset::confirm::<A>),
        ),
        (
            "/v1/magic-link/consume",
            page(MagicLink).post(magic_link::sign_in::<A>),
        ),
        (
            "/v1/invites/accept",
            page(Invite).post(invites::accept::<A>),
        ),
        (
            "/v1/users/{id}/email-change",
            post(email_change::request::<A>),
        ),
        (
            "/v1/email-change/confirm",
            page(EmailChange).post(email_change::confirm::<A>),
        ),
    ];
    let routes = [
        ("/v1/signup", post(signup::signup::<A>)),
        ("/v1/verification/resend", post(verification::resend::<A>)),
        ("/v1/password-reset", post(password_reset::request::<A>)),
        ("/v1/magic-link", post(magic_link::request::<A>)),
        ("/v1/invites", post(invites::invite::<A>)),
    ];
    // The exchange's stored answer holds no address: added outside the layer, on every answer.
    let with_email = middleware::from_fn_with_state(state.clone(), exchange::with_email::<A>);
    // A used code's identity replays only while the code is alive (exchange.rs `live_code`).
    let exchange = post(exchange::exchange::<A>)
        .route_layer(keys.clone())
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            exchange::live_code::<A>,
        ))
        .route_layer(with_email.clone())
        .route_layer(tenant.clone());
    // Login's key is optional: with one a retry replays the identity, without one each
    // request runs (a failure is never stored either way). Every request — a replay too — is
    // counted, throttled and its password checked first, outside the layer, which fingerprints
    // what the check proved (login.rs). Its stored answer, like the exchange's, holds no
    // address.
    let login = post(login::login::<A>)
        .route_layer(keys.clone().optional())
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            login::authenticate::<A>,
        ))
        .route_layer(with_email.clone())
        .route_layer(tenant.clone());
    let router = routes
        .into_iter()
        .fold(Router::new(), |router, (path, route)| {
            router.route(path, guarded(route))
        })
        .route("/v1/exchange", exchange)
        .route("/v1/login", login);
    link_routes
        .into_iter()
        .fold(router, |router, (path, route)| {
            router.route(path, redirecting(route))
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}
