//! Webhooks: what happened, told to the application as Standard Webhooks
//! (<https://www.standardwebhooks.com>), through the outbox.
//!
//! An event is written in the transaction of the state change it reports ([`events::emit`]):
//! one outbox job (kind [`events::WEBHOOK_KIND`]) per event and enabled endpoint of the tenant
//! that subscribed to its type, each carrying the event's id (`webhook-id`, the same on every
//! retry) and its body, serialized once.

pub mod delivery;
pub mod events;
pub mod url;

pub use delivery::{EndpointRef, WebhookDelivery, WebhookSettings, signing_secrets};
pub use events::{Event, EventType, emit, emit_to};
pub use url::UrlPolicy;
