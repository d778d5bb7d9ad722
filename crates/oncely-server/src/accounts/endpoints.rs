//! Webhook endpoints: a tenant's receivers of events, their sealed signing secrets.

use sqlx::FromRow;
use uuid::Uuid;

/// A webhook endpoint to store
/// ([`Accounts::insert_webhook_endpoint`](super::Accounts::insert_webhook_endpoint)).
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

/// The statements of webhook endpoints. One set per dialect (`postgres.rs`, `sqlite.rs`), in
/// [`Statements`](super::Statements).
#[derive(Debug, Clone, Copy)]
pub struct EndpointStatements {
    /// Binds tenant. The tenant's enabled webhook endpoints, oldest first: `id`, `events` (a
    /// JSON array of event types; `[]`: every event).
    pub webhook_targets: &'static str,
    /// Binds id, tenant, url, events (JSON array), secret_sealed, now.
    pub insert_webhook_endpoint: &'static str,
    /// Binds id, now. One endpoint as an [`EndpointRecord`](super::EndpointRecord) (the previous
    /// secret only while its grace runs).
    pub webhook_endpoint: &'static str,
    /// Binds tenant (or NULL: every tenant), now. Endpoints as
    /// [`EndpointRecord`](super::EndpointRecord)s, by tenant, oldest first.
    pub webhook_endpoints: &'static str,
    /// Binds id, now, reason. Disables an endpoint (`reason` NULL: enables it again); changes
    /// no row for an unknown id.
    pub set_webhook_disabled: &'static str,
    /// Binds id, new secret_sealed, grace (seconds, a float), now. The current secret becomes
    /// the previous one until now + grace (grace 0: it stops at once); returns
    /// `previous_secret_expires_at_ms`.
    pub rotate_webhook_secret: &'static str,
    /// Binds id, old sealed secret, new sealed secret. Replaces the endpoint's current or
    /// previous sealed signing secret that is still `old` by `new` (a re-seal under the current
    /// server secret; a concurrent rotation wins).
    pub reseal_webhook_secret: &'static str,
    /// Binds id. Deletes an endpoint.
    pub remove_webhook_endpoint: &'static str,
}
