//! What every `/v1` `POST` handler receives: [`IdempotentPost`] — its tenant, its caller, the
//! idempotency layer's transaction and its JSON body ([`JsonBody`], whose rejections are
//! problems).

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use oncely::{IdempotentTx, TenantId};
use serde::de::DeserializeOwned;

use super::AppState;
use super::error::{ApiError, BodyError};
use super::tenants::Tenant;
use crate::accounts::Accounts;
use crate::client_addr::CallerAddr;
use crate::templates::Locale;

/// `Json<T>` whose rejections are problem+json: 415 without a JSON content type, 413 for a
/// body over the limit, 400 `invalid-request` for anything unreadable (saying what).
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(Self(value)),
            Err(JsonRejection::MissingJsonContentType(_)) => {
                Err(ApiError::Body(BodyError::NotJson))
            }
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::Body(BodyError::TooLarge))
            }
            Err(rejection) if timed_out(&rejection) => Err(ApiError::Body(BodyError::TimedOut)),
            Err(rejection) => Err(ApiError::invalid_request(rejection.body_text())),
        }
    }
}

/// Whether `rejection` comes of a body that did not arrive by its deadline
/// ([`oncely::body::Deadline`]).
fn timed_out(rejection: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(rejection), |e| e.source())
        .any(|e| e.is::<oncely::body::BodyTimedOut>())
}

/// The JSON body of a request, read by a middleware in front of the idempotency layer (which
/// reads it again): `T` with [`JsonBody`]'s answers, and the request with the same bytes. The
/// bytes are read up to the `/v1` routes' limit ([`super::MAX_BODY`], set on the router).
pub async fn peek_json<T: DeserializeOwned>(request: Request) -> Result<(T, Request), ApiError> {
    let (parts, body) = request.into_parts();
    let bytes = match Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await {
        Ok(bytes) => bytes,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(ApiError::Body(BodyError::TooLarge));
        }
        Err(rejection) if timed_out(&rejection) => return Err(ApiError::Body(BodyError::TimedOut)),
        Err(rejection) => return Err(ApiError::invalid_request(rejection.body_text())),
    };
    let copy = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
    let JsonBody(value) = JsonBody::from_request(copy, &()).await?;
    Ok((value, Request::from_parts(parts, Body::from(bytes))))
}

/// A `POST` under `/v1` with a JSON body `T`, behind the transactional idempotency layer (an
/// extractor). Extracted in this order: state, tenant, caller, transaction, body — the caller
/// refuses a bad `Oncely-Client-IP`, the transaction only when the route is not behind the layer.
pub struct IdempotentPost<A: Accounts, T> {
    /// What handlers share.
    pub state: AppState<A>,
    /// The request's tenant, and whether an API key proved it.
    pub tenant: Tenant,
    /// The caller's address (per-client caps, its share of the hashing pool): the peer, or with
    /// an API key the user the backend names ([`CallerAddr::named_by_backend`]).
    pub caller: CallerAddr,
    /// The layer's transaction: `lock()` claims the key in it.
    pub tx: IdempotentTx<A::Database>,
    /// The body.
    pub body: T,
    /// The tags of the request's `Accept-Language`, best first (the language of the emails a
    /// request without `locale` asks for).
    pub accepted_languages: Vec<Locale>,
}

impl<A: Accounts, T> IdempotentPost<A, T> {
    /// The locale the request asks its emails in ([`request_locale`]): `asked` (its body's
    /// `locale`), else its `Accept-Language`.
    pub fn locale(&self, asked: Option<&str>) -> Result<Option<Locale>, ApiError> {
        let accepted = self.accepted_languages.clone();
        request_locale(&self.state, &self.tenant.id, asked, accepted)
    }
}

impl<A: Accounts, T: DeserializeOwned> FromRequest<AppState<A>> for IdempotentPost<A, T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &AppState<A>) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let Ok(tenant) = Tenant::from_request_parts(&mut parts, state).await;
        // With the tenant's API key, the backend names its user (or nobody); else the peer.
        let caller = match tenant.proven {
            true => CallerAddr::named_by_backend(&parts.headers)
                .map_err(|e| ApiError::invalid_request(e).into_response())?,
            false => {
                let Ok(caller) = CallerAddr::from_request_parts(&mut parts, state).await;
                caller
            }
        };
        let accepted_languages = parts
            .headers
            .get(http::header::ACCEPT_LANGUAGE)
            .and_then(|value| value.to_str().ok())
            .map(Locale::accepted)
            .unwrap_or_default();
        let tx = IdempotentTx::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let JsonBody(body) = JsonBody::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self {
            state: state.clone(),
            tenant,
            caller,
            tx,
            body,
            accepted_languages,
        })
    }
}

/// The locale a flow request asks its emails in: its `locale` (400 `invalid-request` if that is
/// not a BCP 47 tag), else the best of its `Accept-Language` that the tenant has templates in
/// (else the first); `None`: the account's, or English.
pub fn request_locale<A: Accounts>(
    state: &AppState<A>,
    tenant: &TenantId,
    locale: Option<&str>,
    accepted: Vec<Locale>,
) -> Result<Option<Locale>, ApiError> {
    match locale {
        Some(tag) => Locale::parse(tag)
            .map(Some)
            .map_err(|why| ApiError::invalid_request(format!("locale: {why}"))),
        None => Ok(state.templates.negotiate(tenant.as_str(), accepted)),
    }
}
