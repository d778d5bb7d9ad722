//! A test inbox that plays the outside world: an SMTP server and a Resend-compatible HTTP API
//! that keep every message they receive, and fail on demand.
//!
//! - [`Inbox`]: the shared store of received messages, the [`Faults`] to inject, the [`Stats`].
//! - [`smtp`]: the SMTP intake (enough of RFC 5321 for real clients such as lettre).
//! - [`http`]: `POST /emails` (Resend-compatible, honours `Idempotency-Key`), and the read API:
//!   `GET /messages?to=`, `GET /messages/{id}`, `DELETE /messages`, `GET /stats`, `PUT /faults`.
//! - [`page`]: the same as pages for a person (`GET /`, `GET /view/{id}`), links clickable.
//!
//! Every copy is kept: a message delivered twice shows twice, and [`Stats::duplicates`] counts
//! it. In *provider mode* ([`Faults::dedupe_window`]) the inbox behaves like a real provider
//! instead: a second message with the same idempotency key inside the window is acknowledged
//! but not delivered again ([`Stats::deduplicated`]).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let inbox = oncely_inbox::Inbox::new();
//! let running = inbox.start("127.0.0.1:0".parse().unwrap(), "127.0.0.1:0".parse().unwrap()).await?;
//! println!("SMTP on {}, HTTP on {}", running.smtp_addr, running.http_addr);
//! # Ok(()) }
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod http;
pub mod page;
pub mod smtp;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// How a message reached the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Intake {
    /// Over SMTP.
    Smtp,
    /// Over the HTTP API.
    Http,
}

/// A received message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// The inbox's id for this copy.
    pub id: String,
    /// How it came in.
    pub intake: Intake,
    /// When (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
    /// Sender.
    pub from: String,
    /// Recipients (lower case).
    pub to: Vec<String>,
    /// Subject line.
    pub subject: String,
    /// Plain-text body.
    pub text: String,
    /// HTML body, if any.
    pub html: Option<String>,
    /// `Message-ID`, if any.
    pub message_id: Option<String>,
    /// The sender's idempotency key (`Idempotency-Key` header, HTTP or SMTP), if any.
    pub idempotency_key: Option<String>,
}

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

/// Faults to inject. Counters are consumed by the attempts that meet them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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
    /// seen within this many milliseconds.
    pub dedupe_window_ms: Option<u64>,
}

impl Faults {
    /// Provider mode with a 24-hour window, like real email APIs.
    pub fn provider() -> Self {
        Self {
            dedupe_window_ms: Some(24 * 60 * 60 * 1000),
            ..Self::default()
        }
    }

    fn dedupe_window(&self) -> Option<Duration> {
        self.dedupe_window_ms.map(Duration::from_millis)
    }
}

/// Counters since start (or the last `DELETE /messages`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Delivery attempts that reached the end of a message.
    pub attempts: u64,
    /// Copies kept (what `GET /messages` lists).
    pub delivered: u64,
    /// Kept copies whose idempotency key (or Message-ID) an earlier kept copy already had.
    pub duplicates: u64,
    /// Provider mode: attempts acknowledged without a new copy.
    pub deduplicated: u64,
    /// Attempts rejected by an injected fault.
    pub rejected: u64,
    /// Accepted messages whose connection was dropped before the answer.
    pub dropped: u64,
}

/// The answer the inbox gives one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted (new copy, or deduplicated in provider mode): the id to report.
    Accepted(String),
    /// Accepted and kept, but the connection must be dropped before answering.
    AcceptedThenDrop(String),
    /// Rejected by an injected fault.
    Rejected(Rejection),
}

#[derive(Default)]
struct State {
    messages: Vec<Message>,
    faults: Faults,
    stats: Stats,
    /// Idempotency key → (first message id, when), for provider mode.
    seen: HashMap<String, (String, Instant)>,
}

/// The inbox: cheap to clone, shared by its SMTP and HTTP intakes and by tests.
#[derive(Clone, Default)]
pub struct Inbox {
    state: Arc<Mutex<State>>,
}

/// A started inbox: where it listens.
#[derive(Debug, Clone, Copy)]
pub struct Running {
    /// The SMTP listener's address.
    pub smtp_addr: SocketAddr,
    /// The HTTP listener's address.
    pub http_addr: SocketAddr,
}

impl Inbox {
    /// An empty inbox with no faults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the SMTP and HTTP listeners (port 0 picks free ports); they run until the runtime
    /// ends.
    pub async fn start(&self, smtp: SocketAddr, http: SocketAddr) -> std::io::Result<Running> {
        let smtp_listener = tokio::net::TcpListener::bind(smtp).await?;
        let http_listener = tokio::net::TcpListener::bind(http).await?;
        let running = Running {
            smtp_addr: smtp_listener.local_addr()?,
            http_addr: http_listener.local_addr()?,
        };
        tokio::spawn(smtp::serve(smtp_listener, self.clone()));
        let router = http::router(self.clone());
        tokio::spawn(async move {
            if let Err(error) = axum::serve(http_listener, router).await {
                tracing::error!(%error, "inbox HTTP server stopped");
            }
        });
        Ok(running)
    }

    /// An inbox with `faults`, listening on free loopback ports (tests, the dev inbox, demos).
    pub async fn start_local(faults: Faults) -> std::io::Result<(Self, Running)> {
        let inbox = Self::new();
        inbox.set_faults(faults);
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let running = inbox.start(loopback, loopback).await?;
        Ok((inbox, running))
    }

    /// Replaces the faults.
    pub fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    /// The faults now in force.
    pub fn faults(&self) -> Faults {
        self.lock().faults.clone()
    }

    /// The delay to apply before answering an attempt.
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.lock().faults.delay_ms)
    }

    /// Every kept copy, oldest first; only those to `to` if given (case-insensitive).
    pub fn messages(&self, to: Option<&str>) -> Vec<Message> {
        let to = to.map(str::to_lowercase);
        self.lock()
            .messages
            .iter()
            .filter(|m| to.as_ref().is_none_or(|to| m.to.contains(to)))
            .cloned()
            .collect()
    }

    /// One copy by id.
    pub fn message(&self, id: &str) -> Option<Message> {
        self.lock().messages.iter().find(|m| m.id == id).cloned()
    }

    /// Forgets every message, counter and seen key (faults stay).
    pub fn clear(&self) {
        let mut state = self.lock();
        state.messages.clear();
        state.stats = Stats::default();
        state.seen.clear();
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.lock().stats
    }

    /// Waits until `n` copies to `to` are kept, or `timeout` passes; returns what is there.
    pub async fn wait_for(&self, to: &str, n: usize, timeout: Duration) -> Vec<Message> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = self.messages(Some(to));
            if found.len() >= n || Instant::now() >= deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Decides one delivery attempt of `message` (its `id` and `received_at` are set here) and
    /// keeps it if accepted. Both intakes call this, after the configured delay.
    pub fn receive(&self, mut message: Message) -> Verdict {
        let mut state = self.lock();
        state.stats.attempts += 1;
        if state.faults.reject_next > 0 {
            state.faults.reject_next -= 1;
            state.stats.rejected += 1;
            return Verdict::Rejected(state.faults.rejection);
        }
        let dedupe_key = message
            .idempotency_key
            .clone()
            .or_else(|| message.message_id.clone());
        let window = state.faults.dedupe_window();
        let seen = dedupe_key.as_ref().and_then(|key| state.seen.get(key));
        if let (Some(window), Some((id, at))) = (window, seen)
            && at.elapsed() < window
        {
            let id = id.clone();
            state.stats.deduplicated += 1;
            return Verdict::Accepted(id);
        }
        message.id = uuid::Uuid::new_v4().to_string();
        message.received_at = OffsetDateTime::now_utc();
        message.to = message.to.iter().map(|t| t.to_lowercase()).collect();
        if let Some(key) = &dedupe_key {
            if state.seen.contains_key(key) {
                state.stats.duplicates += 1;
            }
            state
                .seen
                .insert(key.clone(), (message.id.clone(), Instant::now()));
        }
        let id = message.id.clone();
        state.messages.push(message);
        state.stats.delivered += 1;
        if state.faults.drop_after_accept > 0 {
            state.faults.drop_after_accept -= 1;
            state.stats.dropped += 1;
            return Verdict::AcceptedThenDrop(id);
        }
        Verdict::Accepted(id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-written in a way that
        // matters to a test inbox; keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(key: Option<&str>) -> Message {
        Message {
            id: String::new(),
            intake: Intake::Http,
            received_at: OffsetDateTime::UNIX_EPOCH,
            from: "a@x.io".into(),
            to: vec!["B@X.io".into()],
            subject: "s".into(),
            text: "t".into(),
            html: None,
            message_id: None,
            idempotency_key: key.map(Into::into),
        }
    }

    #[test]
    fn every_copy_is_kept_and_duplicates_are_counted() {
        let inbox = Inbox::new();
        inbox.receive(message(Some("k")));
        inbox.receive(message(Some("k")));
        inbox.receive(message(None));
        assert_eq!(inbox.messages(Some("b@x.io")).len(), 3);
        assert_eq!(inbox.stats().duplicates, 1);
    }

    #[test]
    fn provider_mode_acknowledges_a_repeat_without_delivering_it() {
        let inbox = Inbox::new();
        inbox.set_faults(Faults::provider());
        let Verdict::Accepted(first) = inbox.receive(message(Some("k"))) else {
            panic!()
        };
        assert_eq!(inbox.receive(message(Some("k"))), Verdict::Accepted(first));
        assert_eq!(inbox.messages(None).len(), 1);
        assert_eq!(inbox.stats().deduplicated, 1);
    }

    #[test]
    fn faults_are_consumed_in_order() {
        let inbox = Inbox::new();
        inbox.set_faults(Faults {
            reject_next: 2,
            drop_after_accept: 1,
            ..Faults::default()
        });
        assert_eq!(
            inbox.receive(message(None)),
            Verdict::Rejected(Rejection::Temporary)
        );
        assert_eq!(
            inbox.receive(message(None)),
            Verdict::Rejected(Rejection::Temporary)
        );
        assert!(matches!(
            inbox.receive(message(None)),
            Verdict::AcceptedThenDrop(_)
        ));
        assert!(matches!(inbox.receive(message(None)), Verdict::Accepted(_)));
        let stats = inbox.stats();
        assert_eq!(
            (
                stats.attempts,
                stats.rejected,
                stats.delivered,
                stats.dropped
            ),
            (4, 2, 2, 1)
        );
    }
}
