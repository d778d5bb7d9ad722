//! The HTTP side: a Resend-compatible intake and the read/fault API.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use time::OffsetDateTime;

use crate::{Faults, Inbox, Intake, Message, Rejection, Verdict};

/// The routes, on an [`Inbox`]. The server mounts the read API under `/_dev/inbox` in development.
pub fn router(inbox: Inbox) -> Router {
    Router::new()
        .route("/", get(crate::page::list))
        .route("/view/{id}", get(crate::page::view))
        .route("/emails", post(send_email))
        .route("/messages", get(list).delete(clear))
        .route("/messages/{id}", get(one))
        .route("/stats", get(stats))
        .route("/faults", get(faults).put(set_faults))
        .with_state(inbox)
}

/// A Resend `POST /emails` body (the fields the inbox uses).
#[derive(Debug, Deserialize)]
struct SendEmail {
    from: String,
    to: OneOrMany,
    subject: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    html: Option<String>,
    #[serde(default)]
    headers: std::collections::HashMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

async fn send_email(
    State(inbox): State<Inbox>,
    headers: HeaderMap,
    Json(body): Json<SendEmail>,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let message = Message {
        id: String::new(),
        intake: Intake::Http,
        received_at: OffsetDateTime::now_utc(),
        from: body.from,
        to: match body.to {
            OneOrMany::One(to) => vec![to],
            OneOrMany::Many(to) => to,
        },
        subject: body.subject,
        text: body.text.unwrap_or_default(),
        html: body.html,
        message_id: body.headers.get("Message-ID").cloned(),
        idempotency_key: key,
    };
    tokio::time::sleep(inbox.delay()).await;
    match inbox.receive(message) {
        Verdict::Accepted(id) => Json(json!({ "id": id })).into_response(),
        Verdict::AcceptedThenDrop(_) => {
            // Kept, but the client gets no answer: stall until it gives up (its timeout), the
            // way an accepted request whose response is lost looks from outside.
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        Verdict::Rejected(Rejection::Temporary) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "name": "injected_temporary_failure" })),
        )
            .into_response(),
        Verdict::Rejected(Rejection::Permanent) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({ "name": "injected_permanent_failure" })),
        )
            .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    to: Option<String>,
}

async fn list(State(inbox): State<Inbox>, Query(q): Query<ListQuery>) -> Json<Vec<Message>> {
    Json(inbox.messages(q.to.as_deref()))
}

async fn one(State(inbox): State<Inbox>, Path(id): Path<String>) -> Response {
    match inbox.message(&id) {
        Some(message) => Json(message).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn clear(State(inbox): State<Inbox>) -> StatusCode {
    inbox.clear();
    StatusCode::NO_CONTENT
}

async fn stats(State(inbox): State<Inbox>) -> Json<crate::Stats> {
    Json(inbox.stats())
}

async fn faults(State(inbox): State<Inbox>) -> Json<Faults> {
    Json(inbox.faults())
}

async fn set_faults(State(inbox): State<Inbox>, Json(faults): Json<Faults>) -> Json<Faults> {
    inbox.set_faults(faults);
    Json(inbox.faults())
}
