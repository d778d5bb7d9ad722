//! Running the wrapped handler: in a task of its own, within an optional deadline, its response
//! body read up to the stored limit and never further; and reading the request body.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::{Service, ServiceExt};
use tracing::Instrument;

use super::outcome::{Answer, OutcomeUnknown};
use super::problems;
use crate::store::{Completion, StoredResponse};

/// The service the layer wraps: an axum route (or any infallible service of axum's types).
pub(crate) trait Handler:
    Service<Request<Body>, Response = Response, Error = Infallible, Future: Send + 'static>
    + Send
    + 'static
{
}

impl<S> Handler for S where
    S: Service<Request<Body>, Response = Response, Error = Infallible, Future: Send + 'static>
        + Send
        + 'static
{
}

/// Reads the request body, at most `limit` bytes (413 beyond; 400 if it cannot be read).
pub(crate) async fn read_request_body(body: Body, limit: usize) -> Result<Bytes, Answer> {
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|error| problems::request_body_problem(&error, limit))
}

/// The handler's response as far as the layer read it.
pub(crate) struct HandlerResponse {
    parts: http::response::Parts,
    body: CollectedBody,
}

impl HandlerResponse {
    pub(crate) fn status(&self) -> StatusCode {
        self.parts.status
    }

    /// The handler rejected the request before any effect, or failed: nothing to keep.
    pub(crate) fn releases_key(&self) -> bool {
        let status = self.status();
        status.is_server_error()
            || matches!(
                status.as_u16(),
                400 | 401 | 403 | 408 | 409 | 413 | 415 | 429
            )
    }

    /// What the handler marked its response with: the effect may have happened, the answer
    /// is lost ([`OutcomeUnknown`]).
    pub(crate) fn outcome_unknown(&self) -> Option<&OutcomeUnknown> {
        self.parts.extensions.get::<OutcomeUnknown>()
    }

    /// What to store for replay: the response, or a tombstone if its body is over `max_stored`.
    pub(crate) fn completion(&self, max_stored: usize) -> Completion {
        match &self.body {
            CollectedBody::Whole(bytes) if bytes.len() <= max_stored => {
                Completion::Response(StoredResponse::new(
                    self.parts.status.as_u16(),
                    &self.parts.headers,
                    bytes.clone(),
                ))
            }
            _ => Completion::Tombstone {
                reason: format!(
                    "the response body was larger than the {max_stored} bytes stored for replay"
                ),
            },
        }
    }

    /// The response for the client: the bytes read, then whatever was not read yet.
    pub(crate) fn into_response(self) -> Response {
        Response::from_parts(self.parts, self.body.into_body())
    }
}

/// Why the handler gave no response to store.
pub(crate) enum Failed {
    /// It panicked or ran past its deadline: the answer to send (500 or 503).
    Stopped(Response),
    /// It answered, but its response body failed before the end: the handler itself ran (and
    /// so did its effects). The answer to send if the key is kept: 500.
    BodyFailed(Response),
}

impl Failed {
    /// The answer for the client.
    pub(crate) fn into_response(self) -> Response {
        match self {
            Self::Stopped(response) | Self::BodyFailed(response) => response,
        }
    }
}

/// Runs the handler in a task of its own (a panic becomes a 500) and collects its body, at most
/// `cap + 1` bytes of it: a longer body is never buffered whole. `deadline`, if set, stops the
/// handler (and the collection) after that long (503).
pub(crate) async fn run<S: Handler>(
    inner: S,
    req: Request<Body>,
    deadline: Option<Duration>,
    cap: usize,
) -> Result<HandlerResponse, Failed> {
    let task = tokio::spawn(
        async move {
            let response = inner.oneshot(req).await.into_response();
            let (parts, body) = response.into_parts();
            (parts, CollectedBody::read(body, cap).await)
        }
        .in_current_span(),
    );
    let abort = task.abort_handle();
    let joined = match deadline {
        Some(limit) => match tokio::time::timeout(limit, task).await {
            Ok(joined) => joined,
            Err(_) => {
                abort.abort();
                return Err(Failed::Stopped(problems::request_timeout()));
            }
        },
        None => task.await,
    };
    match joined {
        Ok((parts, Ok(body))) => Ok(HandlerResponse { parts, body }),
        Ok((_, Err(_))) => Err(Failed::BodyFailed(problems::body_failed())),
        Err(_) => Err(Failed::Stopped(problems::internal_error(
            "the handler panicked",
        ))),
    }
}

/// A response body as far as the layer read it.
enum CollectedBody {
    /// The whole body, within the stored limit.
    Whole(Bytes),
    /// Over the limit: the bytes read so far and the rest, still to be streamed to the client.
    Overflow { prefix: Bytes, rest: Body },
}

impl CollectedBody {
    async fn read(mut body: Body, cap: usize) -> Result<Self, axum::Error> {
        let mut buf = BytesMut::new();
        while let Some(frame) = body.frame().await {
            // Trailers are not stored (nor replayed).
            if let Ok(data) = frame?.into_data() {
                buf.extend_from_slice(&data);
                if buf.len() > cap {
                    return Ok(Self::Overflow {
                        prefix: buf.freeze(),
                        rest: body,
                    });
                }
            }
        }
        Ok(Self::Whole(buf.freeze()))
    }

    fn into_body(self) -> Body {
        match self {
            Self::Whole(bytes) => Body::from(bytes),
            Self::Overflow { prefix, rest } => Body::new(PrefixedBody {
                prefix: Some(prefix),
                rest,
            }),
        }
    }
}

/// A body that yields `prefix`, then `rest`.
struct PrefixedBody {
    prefix: Option<Bytes>,
    rest: Body,
}

impl http_body::Body for PrefixedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(prefix))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let prefix = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(rest.lower() + prefix);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + prefix);
        }
        hint
    }
}
