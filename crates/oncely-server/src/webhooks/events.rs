//! Event types, the event body, and writing an event's deliveries in the caller's transaction.

use oncely_outbox::{JobStore, NewJob};
use serde_json::{Map, Value, json};
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

/// The deliveries of `event` to `targets` (a tenant's enabled endpoints, `(id, events)`, as
/// [`Accounts::webhook_targets`] reads them): one outbox job of kind [`WEBHOOK_KIND`] per
/// endpoint that receives its type, with operation key `webhook:<event id>:<endpoint id>`,
/// payload `{endpoint_id, event_id, type, body}`, and the endpoint's id as its outbox partition
/// (each endpoint has its own concurrency limit in the worker). The one place deliveries are
/// built: [`emit`] writes them in a request's transaction, the email handlers' follow-ups hand
/// them to the outbox.
pub fn deliveries(event: &Event, targets: &[(Uuid, String)]) -> Vec<NewJob> {
    deliveries_carrying(event, targets, &Value::String(event.body()), &Map::new())
}

/// As [`deliveries`], each carrying `body` (the body as a string, or what the delivery
/// assembles it from: `{"parts": […]}` around a token, as an `email.requested` event of a
/// token email carries it) and `extra` payload fields.
pub(crate) fn deliveries_carrying(
    event: &Event,
    targets: &[(Uuid, String)],
    body: &Value,
    extra: &Map<String, Value>,
) -> Vec<NewJob> {
    targets
        .iter()
        .filter(|(_, events)| subscribed(events, event.kind))
        .map(|(endpoint, _)| {
            let mut payload = json!({
                "endpoint_id": endpoint,
                "event_id": event.id,
                "type": event.kind.as_str(),
                "body": body,
            });
            if let Some(payload) = payload.as_object_mut() {
                payload.extend(extra.clone());
            }
            NewJob::new(
                format!("webhook:{}:{endpoint}", event.id),
                WEBHOOK_KIND,
                payload,
            )
            .partition(endpoint.to_string())
        })
        .collect()
}

/// Writes `event`'s deliveries ([`deliveries`]) in the caller's transaction. Returns how many
/// were written (0 when the tenant has no endpoint that receives it).
pub async fn emit<A: Accounts>(
    conn: &mut Connection<A>,
    jobs: &A::Jobs,
    tenant: &str,
    event: &Event,
) -> anyhow::Result<usize> {
    let targets = A::webhook_targets(conn, tenant).await?;
    emit_to::<A>(conn, jobs, &targets, event).await
}

/// As [`emit`], to `targets` the caller read in this transaction
/// ([`Accounts::signup_user_counted`] reads them with the signup's user).
pub async fn emit_to<A: Accounts>(
    conn: &mut Connection<A>,
    jobs: &A::Jobs,
    targets: &[(Uuid, String)],
    event: &Event,
) -> anyhow::Result<usize> {
    let jobs_of = deliveries(event, targets);
    for job in &jobs_of {
        jobs.enqueue(conn, job).await?;
    }
    Ok(jobs_of.len())
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
    fn deliveries_go_to_the_subscribed_endpoints_each_in_its_partition_under_its_key() {
        let (all, verified, emails) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let targets = [
            (all, "[]".to_owned()),
            (verified, r#"["user.verified"]"#.to_owned()),
            (emails, r#"["email.sent","email.failed"]"#.to_owned()),
        ];
        let event = Event::new(EventType::EmailSent, json!({ "email_id": "e" }));
        let jobs = deliveries(&event, &targets);
        let keys: Vec<_> = jobs.iter().map(|j| j.operation_key.clone()).collect();
        assert_eq!(
            keys,
            [
                format!("webhook:{}:{all}", event.id),
                format!("webhook:{}:{emails}", event.id)
            ]
        );
        for (job, endpoint) in jobs.iter().zip([all, emails]) {
            assert_eq!(job.kind, WEBHOOK_KIND);
            assert_eq!(
                job.partition.as_deref(),
                Some(endpoint.to_string().as_str())
            );
            assert_eq!(job.payload["body"], json!(event.body()));
            assert_eq!(job.payload["type"], "email.sent");
        }
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
