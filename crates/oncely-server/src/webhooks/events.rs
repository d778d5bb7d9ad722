//! Event types, the event body, and writing an event's deliveries in the caller's transaction.

use oncely_outbox::{JobStore, NewJob};
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use uuid::Uuid;

use crate::accounts::Accounts;
use crate::backend::Connection;

/// The outbox job kind of a webhook delivery: one job per event and endpoint.
pub const WEBHOOK_KIND: &str = "webhook";

/// What an event reports. Its `type` on the wire is [`EventType::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// An account was created (a signup of a new address, an invitation accepted by a new one).
    UserCreated,
    /// An account's address was verified.
    UserVerified,
    /// Someone signed in (a password login, a magic link used).
    UserSignedIn,
    /// An account's address changed (an email change confirmed).
    UserEmailChanged,
    /// An account's password changed (a password reset).
    PasswordChanged,
    /// An invitation was accepted.
    InviteAccepted,
    /// An email was sent (the provider accepted it).
    EmailSent,
    /// An email went dead: it will not be sent, with the reason.
    EmailFailed,
    /// An email to send through the application's own provider (a tenant whose email delivery
    /// is `webhook`): the rendered message and its link.
    EmailRequested,
}

impl EventType {
    /// Every event type, in the order the docs list them.
    pub const ALL: [EventType; 9] = [
        Self::UserCreated,
        Self::UserVerified,
        Self::UserSignedIn,
        Self::UserEmailChanged,
        Self::PasswordChanged,
        Self::InviteAccepted,
        Self::EmailSent,
        Self::EmailFailed,
        Self::EmailRequested,
    ];

    /// The type on the wire: `user.created`, `user.verified`, …
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UserCreated => "user.created",
            Self::UserVerified => "user.verified",
            Self::UserSignedIn => "user.signed_in",
            Self::UserEmailChanged => "user.email_changed",
            Self::PasswordChanged => "password.changed",
            Self::InviteAccepted => "invite.accepted",
            Self::EmailSent => "email.sent",
            Self::EmailFailed => "email.failed",
            Self::EmailRequested => "email.requested",
        }
    }

    /// The event type named `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event: its id (`msg_` and 32 hex digits: the `webhook-id` of every delivery of it), its
/// type, when it happened, and its data (ids and masked addresses; never a token or a hash).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The stable id: the same on every delivery and every retry of this event.
    pub id: String,
    /// What happened.
    pub kind: EventType,
    /// When.
    pub timestamp: OffsetDateTime,
    /// The details.
    pub data: Value,
}

impl Event {
    /// A new event of `kind` with `data`, happening now, with a fresh id.
    pub fn new(kind: EventType, data: Value) -> Self {
        Self {
            id: format!("msg_{}", Uuid::new_v4().simple()),
            kind,
            timestamp: OffsetDateTime::now_utc(),
            data,
        }
    }

    /// The body every delivery of the event sends, byte for byte:
    /// `{"type":…,"timestamp":…,"data":…}` (timestamp in RFC 3339, UTC).
    pub fn body(&self) -> String {
        let timestamp = self
            .timestamp
            .format(&Rfc3339)
            .expect("a UTC timestamp formats as RFC 3339");
        json!({ "type": self.kind.as_str(), "timestamp": timestamp, "data": self.data }).to_string()
    }
}

/// Whether an endpoint subscribed to `events` (a JSON array of types; `[]`: every type)
/// receives `kind`. An unreadable list receives nothing (the CLI writes only valid ones).
pub fn subscribed(events: &str, kind: EventType) -> bool {
    match serde_json::from_str::<Vec<String>>(events) {
        Ok(types) => types.is_empty() || types.iter().any(|t| t == kind.as_str()),
        Err(_) => false,
    }
}

/// Writes `event`'s deliveries in the caller's transaction: one outbox job of kind
/// [`WEBHOOK_KIND`] per enabled endpoint of `tenant` that receives its type, with operation key
/// `webhook:<event id>:<endpoint id>`, payload `{endpoint_id, event_id, type, body}`, and the
/// endpoint's id as its outbox partition (each endpoint has its own concurrency limit:
/// [`crate::workers::webhook_options`]).
/// Returns how many were written (0 when the tenant has no such endpoint).
pub async fn emit<A: Accounts>(
    conn: &mut Connection<A>,
    jobs: &A::Jobs,
    tenant: &str,
    event: &Event,
) -> anyhow::Result<usize> {
    let targets = A::webhook_targets(conn, tenant).await?;
    let mut body = None;
    let mut written = 0;
    for (endpoint, events) in targets {
        if !subscribed(&events, event.kind) {
            continue;
        }
        let body = body.get_or_insert_with(|| event.body());
        let job = NewJob::new(
            format!("webhook:{}:{endpoint}", event.id),
            WEBHOOK_KIND,
            json!({
                "endpoint_id": endpoint,
                "event_id": event.id,
                "type": event.kind.as_str(),
                "body": body,
            }),
        )
        .partition(endpoint.to_string());
        jobs.enqueue(conn, &job).await?;
        written += 1;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_round_trip_and_subscriptions_match() {
        for kind in EventType::ALL {
            assert_eq!(EventType::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(EventType::parse("user.deleted"), None);
        assert!(subscribed("[]", EventType::EmailSent));
        assert!(subscribed(r#"["user.verified"]"#, EventType::UserVerified));
        assert!(!subscribed(r#"["user.verified"]"#, EventType::UserCreated));
        assert!(!subscribed("not json", EventType::UserCreated));
    }

    #[test]
    fn the_body_is_type_timestamp_and_data() {
        let event = Event {
            id: "msg_1".into(),
            kind: EventType::UserVerified,
            timestamp: OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
            data: json!({ "user_id": "u" }),
        };
        let body: Value = serde_json::from_str(&event.body()).unwrap();
        assert_eq!(
            body,
            json!({ "type": "user.verified", "timestamp": "2023-11-14T22:13:20Z", "data": { "user_id": "u" } })
        );
        assert!(
            Event::new(EventType::UserCreated, json!({}))
                .id
                .starts_with("msg_")
        );
    }
}
