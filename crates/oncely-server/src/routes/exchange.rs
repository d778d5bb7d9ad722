//! The authorization-code exchange. A link whose request chose a return URL mints a one-time
//! code when it is used ([`super::use_link::LinkUse::answer`]); its answer redirects the
//! browser there with `?code=…` ([`redirect`]); the application's backend then
//! `POST /v1/exchange`s the code with its tenant's API key and learns who signed in: an
//! [`Identity`].

use axum::Json;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::response::Parts;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use super::post::{IdempotentPost, peek_json};
use super::tenants::Tenant;
use super::use_link::{CODE_ID, CODE_TENANT, RETURN_TO};
use crate::accounts::{Accounts, from_millis};
use crate::code::{self, Code};
use crate::identity::Identity;
use crate::token::{self, Flow};

/// `{ "code": … }`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExchangeRequest {
    /// The `code` parameter of the redirect to the return URL.
    pub code: String,
}

/// `POST /v1/exchange` (tenant API key required): uses the code once and answers who it proves
/// — an [`Identity`] whose `email` [`with_email`] adds outside the idempotency layer, so that the
/// stored answer holds no address. Unknown, used, expired, malformed or another tenant's: the
/// same 400 `code-invalid` (and a code another tenant's key tried is still good for its own).
pub async fn exchange<A: Accounts>(
    post: IdempotentPost<A, ExchangeRequest>,
) -> Result<Json<Value>, ApiError> {
    post.tenant.require_proven()?;
    let tenant = &post.tenant.id;
    let mut conn = post.tx.lock().await?;
    let found = A::exchange_code(&mut conn, tenant.as_str(), &token::hash(&post.body.code))
        .await?
        .ok_or(ApiError::InvalidCode)?;
    let flow = Flow::parse(&found.flow)
        .and_then(code::proof)
        .ok_or_else(|| anyhow::anyhow!("a stored code names no known flow"))?;
    tracing::info!(tenant = %tenant, flow = found.flow, "code exchanged");
    let identity = Identity {
        user_id: found.user_id,
        email: found.email,
        email_verified: found.email_verified,
        tenant: tenant.as_str().to_owned(),
        flow,
        authenticated_at: from_millis(found.authenticated_at_ms),
    };
    without_email(identity)
}

/// Middleware of `POST /v1/exchange`, in front of the idempotency layer: a code whose lifetime
/// is over (or that the tenant never had) is 400 `code-invalid` for every request, a retry under
/// the key of the exchange that used it included. The layer replays a used code's identity to a
/// retry only while the code would still be good: a backend that keys the exchange by the code
/// (natural for a callback that may be reloaded) does not turn a one-minute code into a bearer
/// for the key's retention.
pub async fn live_code<A: Accounts>(
    State(state): State<AppState<A>>,
    request: Request,
    next: Next,
) -> Response {
    let checked = async {
        let (mut parts, body) = request.into_parts();
        let Ok(tenant) = Tenant::from_request_parts(&mut parts, &state).await;
        tenant.require_proven()?;
        let (exchange, request): (ExchangeRequest, _) =
            peek_json(Request::from_parts(parts, body)).await?;
        let hash = token::hash(&exchange.code);
        match state.accounts.code_live(tenant.id.as_str(), &hash).await? {
            true => Ok(request),
            false => Err(ApiError::InvalidCode),
        }
    };
    match checked.await {
        Ok(request) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

/// The answer of a route that proves an identity (exchange, login), as the idempotency layer
/// stores it: without the address, which [`with_email`] adds on the way out.
pub fn without_email(identity: Identity) -> Result<Json<Value>, ApiError> {
    let mut answer = serde_json::to_value(identity).map_err(anyhow::Error::from)?;
    if let Some(fields) = answer.as_object_mut() {
        fields.remove(EMAIL);
    }
    Ok(Json(answer))
}

/// The field of an [`Identity`] that [`with_email`] adds.
const EMAIL: &str = "email";

/// Middleware of `POST /v1/exchange` and `POST /v1/login`, between tenant resolution and the
/// idempotency layer: a 200 answer (the handler's, or the layer's replay of it) gets the user's
/// address, read now. The
/// idempotency table holds no address (as for every other route); a replay names the address
/// the account has.
pub async fn with_email<A: Accounts>(
    State(state): State<AppState<A>>,
    request: Request,
    next: Next,
) -> Response {
    rewrite(request, next, async |parts, mut answer| {
        let user = answer
            .get("user_id")
            .and_then(Value::as_str)
            .and_then(|id| Uuid::parse_str(id).ok());
        let (Some(user), Some(fields)) = (user, answer.as_object_mut()) else {
            return answer_with(parts, &answer);
        };
        match state.accounts.user_email(user).await {
            Ok(Some(email)) => {
                fields.insert(EMAIL.into(), Value::from(email));
                answer_with(parts, &answer)
            }
            Ok(None) => ApiError::Unexpected(anyhow::anyhow!("an exchanged code's user vanished"))
                .into_response(),
            Err(error) => ApiError::from(error).into_response(),
        }
    })
    .await
}

/// The largest answer [`redirect`] reads (a used link's is a few hundred bytes).
const MAX_ANSWER: usize = 64 * 1024;

/// Middleware of the routes that use links, between tenant resolution and the idempotency
/// layer: a 200 JSON answer that carries a code's id and its return URL (the handler's, or the
/// layer's replay of it) becomes `{"status": …, "redirect": "<return URL>?code=<code>"}` — the
/// code derived again from its id with the server secret. The stored answer holds only the id;
/// every replay carries the same redirect, while the link's tenant still lists its URL.
pub async fn redirect<A: Accounts>(
    State(state): State<AppState<A>>,
    request: Request,
    next: Next,
) -> Response {
    rewrite(request, next, async |parts, mut answer| {
        let Some(fields) = answer.as_object_mut() else {
            return answer_with(parts, &answer);
        };
        let id = fields.get(CODE_ID).and_then(Value::as_str);
        let return_to = fields.get(RETURN_TO).and_then(Value::as_str);
        let (Some(id), Some(return_to)) = (id, return_to) else {
            return answer_with(parts, &answer);
        };
        let Ok(id) = Uuid::parse_str(id) else {
            return ApiError::Unexpected(anyhow::anyhow!("a used link's code id is not a UUID"))
                .into_response();
        };
        // A replay, maybe long after: only to a URL its tenant still lists (an operator who
        // removed one, a domain given up, wants no browser sent there again).
        let tenant = fields
            .get(CODE_TENANT)
            .and_then(Value::as_str)
            .unwrap_or_default();
        let listed = match state.accounts.return_urls(tenant).await {
            Ok(urls) => urls.iter().any(|url| url == return_to),
            Err(error) => return ApiError::from(error).into_response(),
        };
        let location = listed.then(|| code::redirect(return_to, &Code::derive(&state.secret, id)));
        for field in [CODE_ID, RETURN_TO, CODE_TENANT] {
            fields.remove(field);
        }
        if let Some(location) = location {
            fields.insert("redirect".into(), Value::from(location));
        }
        answer_with(parts, &answer)
    })
    .await
}

/// Runs the rest of the stack and hands a 200 JSON answer's head and JSON to `edit`, whose
/// response goes out instead; any other response passes as it is (see [`read`]).
async fn rewrite(
    request: Request,
    next: Next,
    edit: impl AsyncFnOnce(Parts, Value) -> Response,
) -> Response {
    match read(next.run(request).await).await {
        Ok((parts, answer)) => edit(parts, answer).await,
        Err(passed) => passed,
    }
}

/// A 200 JSON answer's head and JSON, to rewrite; any other response (a problem, a page, a
/// refusal of the layer) is passed through as the error. A 200 JSON answer that cannot be read
/// (a handler's bug: nothing to answer with) becomes a 500 problem.
async fn read(response: Response) -> Result<(Parts, Value), Response> {
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if response.status() != StatusCode::OK || !json {
        return Err(response);
    }
    let (parts, body) = response.into_parts();
    let unreadable = |error: anyhow::Error| ApiError::Unexpected(error).into_response();
    let bytes = axum::body::to_bytes(body, MAX_ANSWER)
        .await
        .map_err(|e| unreadable(anyhow::anyhow!("an answer could not be read: {e}")))?;
    let answer = serde_json::from_slice(&bytes).map_err(|e| unreadable(e.into()))?;
    Ok((parts, answer))
}

/// `answer` as the body of `parts`' response (its length recomputed).
fn answer_with(mut parts: Parts, answer: &Value) -> Response {
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(answer.to_string()))
}
