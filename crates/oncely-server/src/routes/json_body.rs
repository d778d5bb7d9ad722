//! [`JsonBody`]: a route's JSON body, whose rejections are problems.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::{ApiError, BodyError};

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
            Err(rejection) => Err(ApiError::invalid_request(rejection.body_text())),
        }
    }
}
