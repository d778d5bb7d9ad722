//! Tenants: `Authorization: Bearer <api key>` selects one; no header means the default tenant;
//! a bad key is 401 and never falls back to the default. A key replaced by
//! `oncely tenant rotate-key --grace` still selects its tenant until the grace ends, then it is
//! a bad key ([`Accounts::tenant_by_key`] compares with the database's clock).

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use oncely::TenantId;
use sha2::{Digest, Sha256};

use super::AppState;
use super::error::{ApiError, Unauthorized};
use crate::accounts::Accounts;

/// Marks a request whose tenant [`resolve`] proved with an API key.
#[derive(Debug, Clone)]
struct ProvenByKey;

/// The request's tenant (an extractor): the one [`resolve`] proved with an API key, else the
/// default tenant.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// The tenant the request acts for.
    pub id: TenantId,
    /// Whether an API key proved it (else it is the default tenant, unproven).
    pub proven: bool,
}

impl Tenant {
    /// The tenant an API key proved, if the request sent one. Links (tokens) name their own
    /// tenant; a proven tenant must match it, an anonymous browser request takes the token's.
    pub fn proven(&self) -> Option<&TenantId> {
        self.proven.then_some(&self.id)
    }

    /// 401 unless an API key proved the tenant (for routes that need one).
    pub fn require_proven(&self) -> Result<(), ApiError> {
        match self.proven {
            true => Ok(()),
            false => Err(ApiError::Unauthorized(Unauthorized::KeyRequired)),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let id = parts.extensions.get::<TenantId>();
        Ok(Self {
            id: id.cloned().unwrap_or_default(),
            proven: id.is_some() && parts.extensions.get::<ProvenByKey>().is_some(),
        })
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

/// Resolves the tenant of a request before the idempotency layer scopes its key (the layer reads
/// the [`TenantId`] extension).
pub async fn resolve<A: Accounts>(
    State(state): State<AppState<A>>,
    mut req: Request,
    next: Next,
) -> Response {
    match proven_tenant(&state, req.headers()).await {
        Ok(None) => next.run(req).await,
        Ok(Some(tenant)) => {
            req.extensions_mut().insert(tenant);
            req.extensions_mut().insert(ProvenByKey);
            next.run(req).await
        }
        Err(error) => error.into_response(),
    }
}

/// The tenant the request's `Authorization: Bearer <api key>` proves; `None` without the header;
/// 401 for a malformed or unknown key, or a previous key past its grace.
async fn proven_tenant<A: Accounts>(
    state: &AppState<A>,
    headers: &HeaderMap,
) -> Result<Option<TenantId>, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let invalid = || ApiError::Unauthorized(Unauthorized::InvalidKey);
    let key = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|key| key.starts_with(KEY_PREFIX))
        .ok_or_else(invalid)?;
    let id = state
        .accounts
        .tenant_by_key(&hash_api_key(key))
        .await?
        .ok_or_else(invalid)?;
    let tenant = TenantId::parse(id).map_err(|_| anyhow::anyhow!("stored tenant id is invalid"))?;
    Ok(Some(tenant))
}
