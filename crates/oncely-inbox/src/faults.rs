//! The faults the inbox injects, and how each intake answers them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a rejected attempt looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rejection {
    /// SMTP 451, HTTP 503: try again later.
    #[default]
    Temporary,
    /// SMTP 550, HTTP 422: never.
    Permanent,
}

/// Faults to inject, set with [`crate::Inbox::set_faults`] (all of them) or `PUT /faults`
/// ([`crate::Inbox::merge_faults`]: only the fields the body names; an unknown field is
/// refused). Counters are consumed by the attempts that meet them. Every fault is
/// deterministic, so that a test can count what it caused. They are checked in this order:
/// refused credentials, throttling, rejection; then provider mode's key check; then the drop.
/// Mail and webhooks have their own faults (the `webhook_` fields, checked: delay, rejection,
/// then the signature, then the drop): one channel's faults never touch the other's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Reject this many of the next attempts.
    pub reject_next: u32,
    /// How to reject them.
    pub rejection: Rejection,
    /// Wait this long (milliseconds) before answering each attempt.
    pub delay_ms: u64,
    /// For this many of the next accepted messages: keep the message, then drop the connection
    /// before answering (the sender cannot know it was accepted).
    pub drop_after_accept: u32,
    /// Provider mode: acknowledge, but do not deliver again, a message whose idempotency key was
    /// seen within this many milliseconds; answer 409 `invalid_idempotent_request` when the
    /// key comes with another message, and 409 `concurrent_idempotent_requests` while another
    /// request with the key is still being answered (see [`crate::Conflict`]). `None` (`null`
    /// in `PUT /faults`): off. Keys seen stay known until their window ends, whatever the
    /// faults become or the messages deleted.
    pub dedupe_window_ms: Option<u64>,
    /// Throttle this many of the next attempts: HTTP 429 with `Retry-After`, SMTP 450.
    pub throttle_next: u32,
    /// Throttle every this-many-th attempt (2: every second one), counted over the attempts
    /// that reach this check while it is set (not those `throttle_next` throttled); 0: off.
    pub throttle_every: u32,
    /// The `Retry-After` of a throttled attempt, in seconds (also in the SMTP reply's text).
    pub retry_after_s: u64,
    /// Refuse the credentials of this many of the next attempts: HTTP 401, SMTP 535.
    pub unauthorized_next: u32,
    /// Refuse the credentials of every attempt for this long (milliseconds), counted from when
    /// it is set ([`crate::Inbox::set_faults`], or a `PUT /faults` that names it; a `PUT` of
    /// other fields lets it run on); reading the faults back gives what remains of the period.
    pub unauthorized_for_ms: u64,
    /// Webhooks (`POST /webhooks/{name}`; the faults above are mail's): reject this many of
    /// the next deliveries, not kept, with [`Faults::webhook_reject_status`].
    pub webhook_reject_next: u32,
    /// Webhooks: the status of a rejected delivery (400 to 599; 503 unless set: 500, 429, 410
    /// — which tells a sender to disable the endpoint — …).
    pub webhook_reject_status: u16,
    /// Webhooks: wait this long (milliseconds) before answering each delivery.
    pub webhook_delay_ms: u64,
    /// Webhooks: for this many of the next accepted deliveries, read the whole request, keep
    /// the copy, then close the connection without an answer (the sender cannot know it was
    /// accepted).
    pub webhook_drop_after_accept: u32,
    /// The link scanner: when a message is kept, `GET` every link in it whose origin is one
    /// the operator named ([`crate::Config::scan_origins`], loopback `http://` only; any other
    /// link is recorded as skipped, never fetched; a redirect is not followed), as a
    /// provider's security scanner or a mail client's preview does before the person clicks —
    /// to prove that opening a link's page consumes nothing. What it fetched and the statuses
    /// show in `GET /messages/{id}/links` under `scanned`. `PUT /faults` refuses to switch it
    /// on while no origin is named.
    pub link_scanner: bool,
}

impl Default for Faults {
    /// No fault; a throttled attempt would be told to retry after 1 s.
    fn default() -> Self {
        Self {
            reject_next: 0,
            rejection: Rejection::Temporary,
            delay_ms: 0,
            drop_after_accept: 0,
            dedupe_window_ms: None,
            throttle_next: 0,
            throttle_every: 0,
            retry_after_s: 1,
            unauthorized_next: 0,
            unauthorized_for_ms: 0,
            webhook_reject_next: 0,
            webhook_reject_status: 503,
            webhook_delay_ms: 0,
            webhook_drop_after_accept: 0,
            link_scanner: false,
        }
    }
}

impl Faults {
    /// Provider mode with a 24-hour window, like real email APIs.
    pub fn provider() -> Self {
        Self {
            dedupe_window_ms: Some(24 * 60 * 60 * 1000),
            ..Self::default()
        }
    }

    pub(crate) fn dedupe_window(&self) -> Option<Duration> {
        self.dedupe_window_ms.map(Duration::from_millis)
    }
}

/// Why provider mode refused an attempt with a 409, in Resend's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Conflict {
    /// The key was used with another message: this key can never send this message
    /// (HTTP 409; SMTP 554 5.7.0).
    InvalidIdempotentRequest,
    /// Another request with the key is still being answered: try again shortly (HTTP 409;
    /// SMTP 451 4.7.0).
    ConcurrentIdempotentRequests,
}

impl Conflict {
    /// Resend's error name (`name` in the answer's body).
    pub fn name(self) -> &'static str {
        match self {
            Self::InvalidIdempotentRequest => "invalid_idempotent_request",
            Self::ConcurrentIdempotentRequests => "concurrent_idempotent_requests",
        }
    }

    /// Resend's message for it.
    pub fn message(self) -> &'static str {
        match self {
            Self::InvalidIdempotentRequest => {
                "Same idempotency key used with a different request payload."
            }
            Self::ConcurrentIdempotentRequests => {
                "Same idempotency key used while original request is still in progress."
            }
        }
    }
}
