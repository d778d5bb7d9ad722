//! Webhook endpoints: a tenant's receivers of events, their sealed signing secrets.

use sqlx::FromRow;
use uuid::Uuid;

/// A webhook endpoint to store ([`Accounts::insert_webhook_endpoint`](super::Accounts::insert_webhook_endpoint)).
#[derive(Debug, Clone, Copy)]
pub struct NewEndpoint<'a> {
    /// Its id.
    pub id: Uuid,
    /// The tenant whose events it receives.
    pub tenant: &'a str,
    /// Where they are delivered.
    pub url: &'a str,
    /// A JSON array of the event types it receives (`[]`: every event).
    pub events: &'a str,
    /// Its signing secret, sealed with the server secret.
    pub secret_sealed: &'a str,
}

/// A webhook endpoint as stored (`oncely tenant webhook list`, every delivery): its secrets
/// sealed only.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct EndpointRecord {
    /// Its id.
    pub id: Uuid,
    /// The tenant whose events it receives.
    pub tenant: String,
    /// Where they are delivered.
    pub url: String,
    /// A JSON array of the event types it receives (`[]`: every event).
    pub events: String,
    /// Its signing secret, sealed with the server secret.
    pub secret_sealed: String,
    /// The previous signing secret (sealed), while a rotation's grace runs.
    pub previous_secret_sealed: Option<String>,
    /// Until when the previous secret signs too (Unix milliseconds), while it does.
    pub previous_secret_expires_at_ms: Option<i64>,
    /// When it was added (Unix milliseconds).
    pub created_at_ms: i64,
    /// When it was disabled (Unix milliseconds), if it is.
    pub disabled_at_ms: Option<i64>,
    /// Why: `disabled by an operator`, or the 410 Gone it answered.
    pub disabled_reason: Option<String>,
}
