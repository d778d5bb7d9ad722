//! Tenants: `Authorization: Bearer <api key>` selects one; no header means the default tenant;
//! a bad key is 401 and never falls back to the default.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use oncely::TenantId;
use sha2::{Digest, Sha256};

use super::AppState;
use super::error::{ApiError, Unauthorized};
use crate::accounts::Accounts;

/// Marks a request whose tenant was proven by an API key (invites need one).
#[derive(Debug, Clone)]
pub struct AuthenticatedTenant;

/// The request's tenant: the one [`resolve`] proved with an API key, else the default tenant.
pub struct Tenant(pub TenantId);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Tenant {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Self(
            parts
                .extensions
                .get::<TenantId>()
                .cloned()
                .unwrap_or_default(),
        ))
    }
}

/// The tenant a request proved with an API key, if it sent one. Links (tokens) name their own
/// tenant; a proven tenant must match it, an anonymous browser request takes the token's.
pub struct ProvenTenant(pub Option<TenantId>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ProvenTenant {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let proven = parts.extensions.get::<AuthenticatedTenant>().is_some();
        Ok(Self(
            proven
                .then(|| parts.extensions.get::<TenantId>().cloned())
                .flatten(),
        ))
    }
}

/// API keys start with this, so that leaked ones are recognizable.
pub const KEY_PREFIX: &str = "onc_";

/// A new API key: `onc_` and 256 random bits, base64url.
pub fn new_api_key() -> String {
    format!(
        "{KEY_PREFIX}{}",
        URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
    )
}

/// What is stored of an API key: SHA-256 (the key has 256 bits of entropy; no salt needed).
pub fn hash_api_key(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

/// Resolves the tenant of a request before the idempotency layer scopes its key.
pub async fn resolve<A: Accounts>(
    State(state): State<AppState<A>>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return next.run(req).await;
    };
    let Some(key) = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
    else {
        return ApiError::Unauthorized(Unauthorized::InvalidKey).into_response();
    };
    if !key.starts_with(KEY_PREFIX) {
        return ApiError::Unauthorized(Unauthorized::InvalidKey).into_response();
    }
    match state.accounts.tenant_by_key(&hash_api_key(key)).await {
        Ok(Some(id)) => match TenantId::parse(id) {
            Ok(tenant) => {
                req.extensions_mut().insert(tenant);
                req.extensions_mut().insert(AuthenticatedTenant);
                next.run(req).await
            }
            Err(_) => {
                ApiError::from(anyhow::anyhow!("stored tenant id is invalid")).into_response()
            }
        },
        Ok(None) => ApiError::Unauthorized(Unauthorized::InvalidKey).into_response(),
        Err(error) => ApiError::from(error).into_response(),
    }
}

/// 401 for routes that need an API key.
pub fn require(authenticated: Option<&AuthenticatedTenant>) -> Result<(), ApiError> {
    authenticated
        .map(|_| ())
        .ok_or(ApiError::Unauthorized(Unauthorized::KeyRequired))
}
