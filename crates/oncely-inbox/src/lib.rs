//! A test inbox that plays the outside world: an SMTP server and a Resend-compatible HTTP API
//! that keep the messages they receive, a webhook receiver that checks Standard Webhooks
//! signatures, and fail on demand.
//!
//! - [`Inbox`]: the shared store of received messages (bounded: [`Retention`]), the [`Faults`]
//!   to inject, the [`Stats`], its [`Config`] and [`Clock`].
//! - [`smtp`]: the SMTP intake (enough of RFC 5321 for real clients such as lettre).
//! - [`http`]: `POST /emails` (Resend-compatible), and the read API: `GET /messages?to=`,
//!   `GET /messages/{id}`, `DELETE /messages` (every message, or `{"IDs": [...]}` as Mailpit
//!   takes them; messages only: counters and provider mode's keys stay), `DELETE
//!   /messages/{id}`, `GET /messages/{id}/raw` (the message as it came in), `GET /stats`,
//!   `GET /faults`, `PUT /faults` (changes the fields it names), `POST /reset` (a fresh inbox
//!   for the next test: [`Inbox::clear`]). A browser's cross-origin request that would change
//!   something is refused ([`http::router`]).
//! - For CI ([`runs`], [`links`]): `POST /runs` makes a run whose mail (to any address at
//!   `<id>.run.test`, or `anyone+<id>@any.domain`) is kept apart: `GET /messages?run=`,
//!   `GET /runs/{id}` (its count), `GET /runs`, `DELETE /runs/{id}` (it and its mail);
//!   `GET /messages/wait?to=&run=&count=&timeout=` answers as soon as `count` messages are kept
//!   (200), or at the timeout with what there is (408) ([`Inbox::wait`], woken by each
//!   arrival); `GET /messages/{id}/links` gives a message's links and one-time codes
//!   ([`Inbox::links`]); the link scanner ([`Faults::link_scanner`]) fetches every link of a
//!   message when it arrives whose origin is one its operator named ([`Config::scan_origins`]).
//! - [`webhooks`]: `POST /webhooks/{name}` receives Standard Webhooks deliveries: it checks the
//!   signature (`webhook-id`, `webhook-timestamp` within 5 minutes of the inbox's clock,
//!   `webhook-signature`: any `v1` signature of any secret of `name`; HMAC-SHA256 over
//!   `id.timestamp.body`, compared in constant time) when it knows secrets for `name`
//!   ([`Inbox::set_webhook_secrets`], `PUT /webhooks/{name}/secrets` with `{"secrets":
//!   ["whsec_…"]}`, or a resolver the application installs:
//!   [`Inbox::with_webhook_secrets_from`]); answers 204, or 401 with a problem body naming what
//!   is wrong; keeps every copy with its [`Verification`] (`unverified` when no secret is
//!   known), its headers, body and JSON `type`; counts duplicates by `webhook-id` per name
//!   ([`WebhookStats`], in `GET /stats` under `webhooks`). Read with `GET /webhooks?name=&type=`
//!   (newest first), `GET /webhooks/{id}`, `DELETE /webhooks`; bounded by the same
//!   [`Retention`]. Webhooks have their own faults (the `webhook_` fields of [`Faults`]: reject
//!   the next N with a status of the test's choice, delay, accept then close the connection
//!   without an answer). Secrets are never shown again: no answer, page, log line or `Debug`
//!   holds them.
//! - [`page`]: the same as pages for a person who keeps them open (`GET /`, `GET /view/{id}`):
//!   live, searchable, times in the reader's zone, headers and raw source, deletes and faults
//!   from the page, the webhooks received beside the emails, and the emails the sender chose
//!   not to send when given a feed of them ([`page::Options`]).
//!
//! Every copy is kept: a message delivered twice shows twice, and [`Stats::duplicates`] counts
//! it. In *provider mode* ([`Faults::dedupe_window_ms`]) the inbox behaves like a real provider
//! (Resend) instead, keyed by the one idempotency header the intake reads
//! ([`Config::http_idempotency_header`], [`Config::smtp_idempotency_header`]): a repeat of a key
//! inside the window with the same message is acknowledged but not delivered again
//! ([`Stats::deduplicated`]); with another message it is refused (409
//! `invalid_idempotent_request`), and so is a request whose key is still being answered in
//! another one (409 `concurrent_idempotent_requests`); see [`Conflict`].
//!
//! Messages are indexed by id, recipient and key; the oldest go when there are more than
//! [`Retention::max_messages`], they are older than [`Retention::max_age`], or what the inbox
//! holds of them and of the webhooks would take more than [`Retention::max_bytes`] (one message
//! larger than [`Retention::max_message_bytes`] as sent, or alone larger than the budget as
//! kept, is refused: [`Verdict::TooLarge`]); provider mode forgets a key when its window ends.
//! The accepted delivery keys ([`Inbox::delivery`]) are kept apart and outlive the messages.
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

mod clock;
mod faults;
pub mod http;
pub mod links;
mod messages;
pub mod page;
pub mod runs;
pub mod smtp;
pub mod webhooks;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

pub use clock::Clock;
pub use faults::{Conflict, Faults, Rejection};
pub use links::{Extracted, Origin, Scan};
use messages::{ByArrival, Deliveries, Messages, SeenKeys, fingerprint};
pub use messages::{DEFAULT_MAX_BYTES, Delivery, MAX_MESSAGE_BYTES, MAX_RECIPIENTS, Retention};
pub use runs::Run;
use runs::Runs;
pub use webhooks::{
    Headers as WebhookHeaders, Problem, SecretError, SecretsResolver, Verification, Webhook,
    WebhookStats,
};
use webhooks::{Key, Webhooks};

/// The idempotency header the HTTP intake reads by default (Resend's API, and most APIs).
pub const HTTP_IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// The idempotency header the SMTP intake reads by default (Resend's SMTP service).
pub const SMTP_IDEMPOTENCY_HEADER: &str = "Resend-Idempotency-Key";

/// What [`Inbox::wait`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waited {
    /// The matching copies, oldest first.
    pub messages: Vec<Message>,
    /// Whether as many as were asked for came in time.
    pub complete: bool,
}

/// A message's links and codes ([`Inbox::links`], `GET /messages/{id}/links`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Links {
    /// The message's id.
    pub id: String,
    /// Its `http(s)` links, in order ([`links`]).
    pub links: Vec<String>,
    /// Its one-time codes, in order ([`links`]).
    pub codes: Vec<String>,
    /// What the link scanner did with each link, once it has ([`Faults::link_scanner`]);
    /// `null` when it has not (off when the message came, or still fetching).
    pub scanned: Option<Vec<Scan>>,
}

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
    /// Where replies go (`Reply-To` over SMTP, `reply_to` over HTTP), if the sender named it:
    /// the addresses, `Name <address>` where a name was given, joined by `, `.
    #[serde(default)]
    pub reply_to: Option<String>,
    /// `Message-ID`, if any.
    pub message_id: Option<String>,
    /// The sender's idempotency key: the value of the one header its intake reads
    /// ([`Config`]), if it was sent.
    pub idempotency_key: Option<String>,
    /// The message as it came in: over SMTP the DATA section (headers and body, dot-stuffing
    /// undone), over HTTP the headers the intake read and the JSON body. Not in the JSON of
    /// `GET /messages`: `GET /messages/{id}/raw` serves it.
    #[serde(skip)]
    pub raw: String,
}

/// What [`Inbox::search`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The newest matching copies, newest first, each with how many kept copies share its
    /// idempotency key (else its `Message-ID`): more than 1 for a duplicate.
    pub messages: Vec<(Message, usize)>,
    /// How many copies match in all.
    pub matching: usize,
}

/// How an inbox is set up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// How much it keeps.
    pub retention: Retention,
    /// The header the HTTP intake reads the idempotency key from ([`HTTP_IDEMPOTENCY_HEADER`]).
    pub http_idempotency_header: String,
    /// The header the SMTP intake reads the idempotency key from ([`SMTP_IDEMPOTENCY_HEADER`]).
    /// Only this one: a sender that sends another (or none) is not deduplicated.
    pub smtp_idempotency_header: String,
    /// The origins whose links the link scanner opens ([`Faults::link_scanner`]); it opens no
    /// other link, and with none named it cannot be switched on over HTTP (`PUT /faults` is 400)
    /// and opens nothing. Named by the operator (`oncely inbox --scan-origin`, the dev inbox:
    /// its service's public URL; [`Inbox::set_scan_origins`]), never over the inbox's HTTP API:
    /// whoever can reach that must not make the inbox fetch another service of the machine.
    #[serde(default)]
    pub scan_origins: Vec<Origin>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            retention: Retention::default(),
            http_idempotency_header: HTTP_IDEMPOTENCY_HEADER.to_owned(),
            smtp_idempotency_header: SMTP_IDEMPOTENCY_HEADER.to_owned(),
            scan_origins: Vec::new(),
        }
    }
}

/// Counters since start, or the last full reset ([`Inbox::clear`], `POST /reset`): deleting
/// messages does not change them (except `kept`), as they count what happened, not what the
/// mailbox holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Delivery attempts that reached the end of a message.
    pub attempts: u64,
    /// Copies delivered (kept when they came; retention and deletes may remove them since).
    pub delivered: u64,
    /// Copies kept now (what `GET /messages` lists).
    pub kept: u64,
    /// Delivered copies whose idempotency key (or Message-ID) a kept copy already had.
    pub duplicates: u64,
    /// Provider mode: attempts acknowledged without a new copy.
    pub deduplicated: u64,
    /// Provider mode: attempts refused because their key came with another message (409
    /// `invalid_idempotent_request`).
    pub mismatched: u64,
    /// Provider mode: attempts refused because another request with their key was still being
    /// answered (409 `concurrent_idempotent_requests`).
    pub concurrent: u64,
    /// Attempts rejected by an injected fault.
    pub rejected: u64,
    /// Attempts throttled by an injected fault.
    pub throttled: u64,
    /// Attempts whose credentials an injected fault refused.
    pub unauthorized: u64,
    /// Accepted messages whose connection was dropped before the answer.
    pub dropped: u64,
    /// Copies removed by the retention bound (count, age or bytes).
    pub evicted: u64,
    /// Attempts refused because the message is larger than the inbox takes
    /// ([`Verdict::TooLarge`]).
    #[serde(default)]
    pub too_large: u64,
    /// The webhooks' counters (`POST /webhooks/{name}`).
    #[serde(default)]
    pub webhooks: WebhookStats,
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
    /// Throttled by an injected fault: try again after this many seconds.
    Throttled(u64),
    /// The credentials refused by an injected fault.
    Unauthorized,
    /// Provider mode refused the key.
    Conflict(Conflict),
    /// Refused: as the inbox would keep it, the message alone takes more than its byte budget
    /// ([`Retention::max_bytes`]); HTTP 413, SMTP 552. (A message larger than
    /// [`Retention::max_message_bytes`] as sent is refused by the intake before it is read in
    /// full, with the same answer.)
    TooLarge,
}

/// The answer the inbox gives one webhook delivery ([`Inbox::receive_webhook`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookVerdict {
    /// Kept and accepted (verified, or unverified when no secret is known): 204. The copy's id.
    Accepted(String),
    /// Kept and accepted, but the connection is closed without an answer
    /// ([`Faults::webhook_drop_after_accept`]).
    AcceptedThenDrop(String),
    /// Kept, marked invalid, refused (401) for this reason. The copy's id.
    Invalid(String, Problem),
    /// Rejected by an injected fault with this status; not kept.
    Rejected(u16),
}

struct State {
    config: Config,
    clock: Clock,
    messages: Messages,
    faults: Faults,
    /// When refused credentials end ([`Faults::unauthorized_for_ms`]).
    unauthorized_until: Option<OffsetDateTime>,
    /// Attempts that met [`Faults::throttle_every`].
    throttle_count: u64,
    stats: Stats,
    /// Provider mode: the keys seen within the window.
    seen: SeenKeys,
    /// Provider mode: the keys of requests being answered now.
    in_flight: HashSet<String>,
    /// The delivery keys of every accepted message ([`Inbox::delivery`]).
    deliveries: Deliveries,
    /// The webhooks received.
    webhooks: Webhooks,
    /// The signing keys set per endpoint name ([`Inbox::set_webhook_secrets`]).
    webhook_keys: HashMap<String, Vec<Key>>,
    /// Where to ask for the secrets of a name with none set.
    webhook_resolver: Option<SecretsResolver>,
    /// The runs created ([`Inbox::create_run`]).
    runs: Runs,
}

impl State {
    fn new(config: Config) -> Self {
        Self {
            config,
            clock: Clock::system(),
            messages: Messages::default(),
            faults: Faults::default(),
            unauthorized_until: None,
            throttle_count: 0,
            stats: Stats::default(),
            seen: SeenKeys::default(),
            in_flight: HashSet::new(),
            deliveries: Deliveries::default(),
            webhooks: Webhooks::default(),
            webhook_keys: HashMap::new(),
            webhook_resolver: None,
            runs: Runs::default(),
        }
    }

    /// The faults in force at `now` (see [`Inbox::faults`]).
    fn faults_at(&self, now: OffsetDateTime) -> Faults {
        let remaining = self.unauthorized_until.map_or(0, |end| {
            u64::try_from((end - now).whole_microseconds()).unwrap_or(0)
        });
        Faults {
            unauthorized_for_ms: remaining.div_ceil(1000),
            ..self.faults.clone()
        }
    }

    /// Applies the retention bound and forgets keys whose window ended. The byte budget covers
    /// messages and webhooks together: beyond it the older of the two oldest entries goes
    /// first (a message on a tie).
    fn expire(&mut self, now: OffsetDateTime) {
        self.stats.evicted += self.messages.evict(&self.config.retention, now);
        self.stats.webhooks.evicted += self.webhooks.evict(&self.config.retention, now);
        while self.messages.bytes() + self.webhooks.bytes() > self.config.retention.max_bytes {
            match (self.messages.oldest(), self.webhooks.oldest()) {
                (None, None) => break,
                (Some((_, message_at)), Some((webhook, webhook_at))) if webhook_at < message_at => {
                    self.webhooks.remove_arrival(webhook);
                    self.stats.webhooks.evicted += 1;
                }
                (Some((message, _)), _) => {
                    self.messages.remove_arrival(message);
                    self.stats.evicted += 1;
                }
                (None, Some((webhook, _))) => {
                    self.webhooks.remove_arrival(webhook);
                    self.stats.webhooks.evicted += 1;
                }
            }
        }
        self.seen.expire(now);
        self.runs.expire(now - self.config.retention.max_age);
    }

    /// The injected fault this attempt meets before its message is looked at, if any.
    fn refusal(&mut self, now: OffsetDateTime) -> Option<Verdict> {
        let faults = &mut self.faults;
        if faults.unauthorized_next > 0 {
            faults.unauthorized_next -= 1;
            self.stats.unauthorized += 1;
            return Some(Verdict::Unauthorized);
        }
        if self.unauthorized_until.is_some_and(|end| now < end) {
            self.stats.unauthorized += 1;
            return Some(Verdict::Unauthorized);
        }
        let throttled = if faults.throttle_next > 0 {
            faults.throttle_next -= 1;
            true
        } else if faults.throttle_every > 0 {
            self.throttle_count += 1;
            self.throttle_count
                .is_multiple_of(u64::from(faults.throttle_every))
        } else {
            false
        };
        if throttled {
            self.stats.throttled += 1;
            return Some(Verdict::Throttled(faults.retry_after_s));
        }
        if faults.reject_next > 0 {
            faults.reject_next -= 1;
            self.stats.rejected += 1;
            return Some(Verdict::Rejected(faults.rejection));
        }
        None
    }
}

/// The inbox: cheap to clone, shared by its SMTP and HTTP intakes and by tests.
#[derive(Clone)]
pub struct Inbox {
    state: Arc<Mutex<State>>,
    /// Woken whenever a copy is kept, for those waiting for messages ([`Inbox::wait`]).
    arrived: Arc<tokio::sync::Notify>,
}

impl Default for Inbox {
    fn default() -> Self {
        Self::with_config(Config::default())
    }
}

/// A started inbox: where it listens.
#[derive(Debug, Clone, Copy)]
pub struct Running {
    /// The SMTP listener's address.
    pub smtp_addr: SocketAddr,
    /// The HTTP listener's address.
    pub http_addr: SocketAddr,
}

/// A request being answered in provider mode: its key counts as in flight until it is dropped.
struct InFlight {
    inbox: Inbox,
    key: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.inbox.lock().in_flight.remove(&self.key);
    }
}

/// A message being decided ([`Delivery::deciding`]) until this is dropped (also when the
/// attempt's task is cancelled mid-delay). It holds the message's delivery keys, not a copy of
/// the message.
struct Deciding {
    inbox: Inbox,
    keys: Vec<messages::KeyDigest>,
}

impl Deciding {
    fn new(inbox: &Inbox, message: &Message) -> Self {
        let keys = Deliveries::keys_of(message);
        inbox.lock().deliveries.deciding(&keys, true);
        Self {
            inbox: inbox.clone(),
            keys,
        }
    }
}

impl Drop for Deciding {
    fn drop(&mut self) {
        self.inbox.lock().deliveries.deciding(&self.keys, false);
    }
}

impl Inbox {
    /// An empty inbox with no faults and the default [`Config`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty inbox with no faults, set up as `config` says.
    pub fn with_config(config: Config) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::new(config))),
            arrived: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Reads the time from `clock` (tests: [`Clock::manual`]) instead of the system's.
    pub fn with_clock(self, clock: Clock) -> Self {
        self.lock().clock = clock;
        self
    }

    /// Starts the SMTP and HTTP listeners (port 0 picks free ports); they run until the runtime
    /// ends.
    pub async fn start(&self, smtp: SocketAddr, http: SocketAddr) -> std::io::Result<Running> {
        // The error names the address: "Address already in use" alone does not say which.
        let bind = async |what: &str, addr: SocketAddr| {
            tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot listen on {addr} ({what}): {e}"))
            })
        };
        let smtp_listener = bind("SMTP", smtp).await?;
        let http_listener = bind("HTTP", http).await?;
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
        Self::with_config(Config::default())
            .start_local_with(faults)
            .await
    }

    /// This inbox with `faults`, listening on free loopback ports.
    pub async fn start_local_with(self, faults: Faults) -> std::io::Result<(Self, Running)> {
        self.set_faults(faults);
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let running = self.start(loopback, loopback).await?;
        Ok((self, running))
    }

    /// How it is set up.
    pub fn config(&self) -> Config {
        self.lock().config.clone()
    }

    /// Names the origins whose links the link scanner opens ([`Config::scan_origins`]),
    /// replacing those named before: for a test that learns its service's address after
    /// starting the inbox. Messages already being scanned keep the origins of their arrival.
    pub fn set_scan_origins(&self, origins: impl IntoIterator<Item = Origin>) {
        self.lock().config.scan_origins = origins.into_iter().collect();
    }

    /// The largest message the intakes take as sent ([`Retention::max_message_bytes`]).
    pub fn max_message_bytes(&self) -> usize {
        self.lock().config.retention.max_message_bytes()
    }

    /// Counts an attempt an intake refused as larger than [`Inbox::max_message_bytes`] before
    /// reading all of it ([`Stats::too_large`]).
    pub(crate) fn count_too_large(&self) {
        let mut state = self.lock();
        state.stats.attempts += 1;
        state.stats.too_large += 1;
    }

    /// The header `intake` reads the idempotency key from.
    pub fn idempotency_header(&self, intake: Intake) -> String {
        let state = self.lock();
        match intake {
            Intake::Http => state.config.http_idempotency_header.clone(),
            Intake::Smtp => state.config.smtp_idempotency_header.clone(),
        }
    }

    /// Replaces every fault (`PUT /faults` changes only the fields it names:
    /// [`Inbox::merge_faults`]). A period of refused credentials starts now. Provider mode's
    /// seen keys stay whatever the faults become: a key is forgotten when its window ends (a
    /// mode switched off stops deduplicating; switched on again, it knows the keys of its
    /// window), or by a full reset ([`Inbox::clear`]).
    pub fn set_faults(&self, faults: Faults) {
        let mut state = self.lock();
        let now = state.clock.now();
        state.unauthorized_until = (faults.unauthorized_for_ms > 0)
            .then(|| now + Duration::from_millis(faults.unauthorized_for_ms));
        state.faults = faults;
    }

    /// Changes the faults `patch` names (a JSON object of [`Faults`] fields, as `PUT /faults`
    /// takes it) and leaves the others as they are: `{"throttle_next": 1}` throttles one
    /// attempt and keeps provider mode, `{"dedupe_window_ms": null}` turns provider mode off. A
    /// period of refused credentials starts now if `patch` names `unauthorized_for_ms`, and
    /// otherwise runs on. Seen keys stay, as with [`Inbox::set_faults`]. An unknown field or a
    /// value of the wrong type changes nothing and is the error. Returns the faults now in
    /// force.
    pub fn merge_faults(
        &self,
        patch: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Faults, serde_json::Error> {
        let mut state = self.lock();
        let now = state.clock.now();
        let mut merged = serde_json::to_value(state.faults_at(now))?;
        if let Some(fields) = merged.as_object_mut() {
            fields.extend(patch.clone());
        }
        let faults: Faults = serde_json::from_value(merged)?;
        let switched_on = patch.get("link_scanner") == Some(&serde_json::Value::Bool(true));
        if switched_on && state.config.scan_origins.is_empty() {
            return Err(serde::de::Error::custom(
                "link_scanner: the link scanner opens only links to the origins its operator \
                 named, and none is named: start the inbox with --scan-origin URL (e.g. \
                 http://127.0.0.1:8080, the service whose links it should open); the dev inbox \
                 names its service's public URL when that is http:// on loopback",
            ));
        }
        if !(400..=599).contains(&faults.webhook_reject_status) {
            return Err(serde::de::Error::custom(
                "webhook_reject_status must be an HTTP error status (400 to 599)",
            ));
        }
        if patch.contains_key("unauthorized_for_ms") {
            state.unauthorized_until = (faults.unauthorized_for_ms > 0)
                .then(|| now + Duration::from_millis(faults.unauthorized_for_ms));
        }
        state.faults = faults;
        Ok(state.faults_at(now))
    }

    /// The faults now in force (counters as consumed so far; what remains of a period of
    /// refused credentials, rounded up to the millisecond).
    pub fn faults(&self) -> Faults {
        let state = self.lock();
        let now = state.clock.now();
        state.faults_at(now)
    }

    /// The delay to apply before answering an attempt.
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.lock().faults.delay_ms)
    }

    /// Every kept copy, oldest first; only those to `to` if given (case-insensitive; by index).
    pub fn messages(&self, to: Option<&str>) -> Vec<Message> {
        let to = to.map(str::to_lowercase);
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        state.messages.list(to.as_deref())
    }

    /// The newest kept copies whose sender, a recipient or subject contains `query` (ignoring
    /// case; empty: every copy), at most `limit`, newest first ([`Found`]).
    pub fn search(&self, query: &str, limit: usize) -> Found {
        let query = query.trim().to_lowercase();
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        let (messages, matching) = state.messages.search(&query, limit);
        Found { messages, matching }
    }

    /// How many kept copies share `message`'s idempotency key (else its `Message-ID`): 1 when
    /// no other does.
    pub fn copies(&self, message: &Message) -> usize {
        self.lock().messages.copies(message)
    }

    /// One copy by id (by index).
    pub fn message(&self, id: &str) -> Option<Message> {
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        state.messages.get(id).cloned()
    }

    /// Deletes the copies with these ids (unknown ones are ignored); returns how many went.
    /// Counters and provider mode's keys stay: a provider remembers a key whatever becomes of
    /// the mailbox.
    pub fn delete(&self, ids: &[String]) -> usize {
        let mut state = self.lock();
        ids.iter().filter(|id| state.messages.remove(id)).count()
    }

    /// Deletes every copy (`DELETE /messages`); returns how many went. Like
    /// [`Inbox::delete`], it deletes messages only: the counters and provider mode's keys stay
    /// (a repeat of a known key is still deduplicated, or refused with another message).
    pub fn delete_all(&self) -> usize {
        let mut state = self.lock();
        let deleted = state.messages.len();
        state.messages.clear();
        deleted
    }

    /// A full reset, for a test that wants a fresh inbox (`POST /reset`): forgets every
    /// message, webhook, counter, provider mode's seen key and accepted delivery key
    /// ([`Inbox::delivery`]). The faults, the config and the
    /// webhook secrets stay. A real
    /// provider never forgets a key early; [`Inbox::delete_all`] is what a mailbox cleanup
    /// does.
    pub fn clear(&self) {
        let mut state = self.lock();
        state.messages.clear();
        state.webhooks.clear();
        state.stats = Stats::default();
        state.seen.clear();
        let now = state.clock.now();
        state.deliveries.clear(now);
        state.runs.clear();
    }

    /// Whether the inbox accepted a message under the delivery key `key` — its idempotency key,
    /// its `Message-ID` as the inbox shows it (`key@host`), or the `key` of that — and how many
    /// copies
    /// (`GET /deliveries/{key}`). The question a sender asks its provider when an answer was
    /// lost: deleting messages ([`Inbox::delete_all`]) or their retention does not change the
    /// answer, only a full reset ([`Inbox::clear`]) does. A message accepted and then its
    /// connection dropped ([`Faults::drop_after_accept`]) was accepted.
    pub fn delivery(&self, key: &str) -> Delivery {
        self.lock().deliveries.get(key)
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        Stats {
            kept: state.messages.len() as u64,
            webhooks: WebhookStats {
                kept: state.webhooks.len() as u64,
                ..state.stats.webhooks
            },
            ..state.stats
        }
    }

    /// Waits until `n` copies to `to` are kept, or `timeout` passes; returns what is there.
    pub async fn wait_for(&self, to: &str, n: usize, timeout: Duration) -> Vec<Message> {
        self.wait(Some(to), None, n, timeout).await.messages
    }

    /// The kept copies to `to` (case-insensitive) and of `run`, whichever are given (both: the
    /// run's copies to `to`; neither: every copy), oldest first. A run that does not exist has
    /// none ([`Inbox::run`] tells whether it does).
    pub fn matching(&self, to: Option<&str>, run: Option<&str>) -> Vec<Message> {
        let to = to.map(str::to_lowercase);
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        state.messages.matching(to.as_deref(), run)
    }

    /// How many kept messages match `to` and `run` (as [`Inbox::matching`]), copying none.
    fn count_matching(&self, to: Option<&str>, run: Option<&str>) -> usize {
        let to = to.map(str::to_lowercase);
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        state.messages.count_matching(to.as_deref(), run)
    }

    /// Waits until at least `n` copies match `to` and `run` (as [`Inbox::matching`]: kept
    /// copies count, those kept before the wait began included), or `timeout` passes; returns
    /// what matches then, and whether there were `n`. Woken by each arrival, never polling.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use std::time::Duration;
    /// let inbox = oncely_inbox::Inbox::new();
    /// let waited = inbox.wait(Some("ada@example.com"), None, 1, Duration::from_millis(10)).await;
    /// assert!(!waited.complete && waited.messages.is_empty());
    /// # }
    /// ```
    pub async fn wait(
        &self,
        to: Option<&str>,
        run: Option<&str>,
        n: usize,
        timeout: Duration,
    ) -> Waited {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before looking, so that an arrival in between is not missed.
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            // Counted, not copied: every arrival wakes every wait, and a wait's matches may be
            // many and large; they are copied once, when it answers.
            if self.count_matching(to, run) >= n {
                let messages = self.matching(to, run);
                // (Unless some expired in between: then it waits on.)
                if messages.len() >= n {
                    return Waited {
                        messages,
                        complete: true,
                    };
                }
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                let messages = self.matching(to, run);
                return Waited {
                    complete: messages.len() >= n,
                    messages,
                };
            }
        }
    }

    /// Creates a run ([`runs`]): mail to its domain or plus tag is kept apart under it.
    pub fn create_run(&self) -> Run {
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        let id = state.runs.create(now);
        runs::summary(&id, now, state.messages.count_run(&id))
    }

    /// The run `id` with how many of its messages are kept, if it exists.
    pub fn run(&self, id: &str) -> Option<Run> {
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        let created_at = state.runs.created_at(id)?;
        Some(runs::summary(id, created_at, state.messages.count_run(id)))
    }

    /// Every run that exists, oldest first.
    pub fn runs(&self) -> Vec<Run> {
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        let state = &*state;
        state
            .runs
            .ids()
            .filter_map(|id| {
                let created_at = state.runs.created_at(id)?;
                Some(runs::summary(id, created_at, state.messages.count_run(id)))
            })
            .collect()
    }

    /// Deletes the run `id` and its kept messages; how many messages went, or `None` if there
    /// is no such run. Counters and provider mode's keys stay, as with [`Inbox::delete`].
    pub fn delete_run(&self, id: &str) -> Option<usize> {
        let mut state = self.lock();
        if !state.runs.remove(id) {
            return None;
        }
        Some(state.messages.delete_run(id))
    }

    /// The links and one-time codes of message `id` ([`links`]), and what the link scanner did
    /// with them, if it has; `None` if there is no such message.
    pub fn links(&self, id: &str) -> Option<Links> {
        let (message, scanned) = {
            let mut state = self.lock();
            let now = state.clock.now();
            state.expire(now);
            let message = state.messages.get(id)?.clone();
            (message, state.messages.scans(id).cloned())
        };
        // Outside the lock: a large message takes a while, and nothing else waits for it.
        let Extracted { links, codes } = links::extract(&message);
        Some(Links {
            id: id.to_owned(),
            links,
            codes,
            scanned,
        })
    }

    /// Keeps what the link scanner did with the links of message `id` (counted in the byte
    /// budget: the oldest go if it is exceeded).
    fn record_scans(&self, id: &str, scans: Vec<Scan>) {
        let mut state = self.lock();
        state.messages.set_scans(id, scans);
        let now = state.clock.now();
        state.expire(now);
    }

    /// Answers one delivery attempt as both intakes do: in provider mode, a key already in
    /// flight in another request is refused ([`Conflict::ConcurrentIdempotentRequests`]);
    /// otherwise the key is in flight while the configured delay passes, then
    /// [`Inbox::receive`] decides.
    pub async fn attempt(&self, message: Message) -> Verdict {
        let in_flight = match self.begin(message.idempotency_key.as_deref()) {
            Ok(in_flight) => in_flight,
            Err(verdict) => return verdict,
        };
        // Being decided until the verdict: a lookup of its key meanwhile says so.
        let deciding = Deciding::new(self, &message);
        let delay = self.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let verdict = self.receive(message);
        drop(deciding);
        drop(in_flight);
        verdict
    }

    /// Marks `key` in flight (provider mode), or refuses it if it is already.
    fn begin(&self, key: Option<&str>) -> Result<Option<InFlight>, Verdict> {
        let mut state = self.lock();
        let (Some(key), Some(_)) = (key, state.faults.dedupe_window()) else {
            return Ok(None);
        };
        if !state.in_flight.insert(key.to_owned()) {
            state.stats.attempts += 1;
            state.stats.concurrent += 1;
            return Err(Verdict::Conflict(Conflict::ConcurrentIdempotentRequests));
        }
        Ok(Some(InFlight {
            inbox: self.clone(),
            key: key.to_owned(),
        }))
    }

    /// Decides one delivery attempt of `message` (its `id` and `received_at` are set here) and
    /// keeps it if accepted. [`Inbox::attempt`] calls this after the configured delay.
    pub fn receive(&self, mut message: Message) -> Verdict {
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        state.stats.attempts += 1;
        message.to = message.to.iter().map(|t| t.to_lowercase()).collect();
        message.id = uuid::Uuid::new_v4().to_string();
        // Before any fault: a message that cannot be kept consumes none.
        if messages::kept_size(&message) > state.config.retention.max_bytes {
            state.stats.too_large += 1;
            return Verdict::TooLarge;
        }
        if let Some(refused) = state.refusal(now) {
            return refused;
        }
        let fingerprint = fingerprint(&message);
        let window = state.faults.dedupe_window();
        let key = message.idempotency_key.clone().filter(|_| window.is_some());
        if let Some(seen) = key.as_deref().and_then(|key| state.seen.get(key, now)) {
            if seen.fingerprint != fingerprint {
                state.stats.mismatched += 1;
                return Verdict::Conflict(Conflict::InvalidIdempotentRequest);
            }
            let id = seen.id.clone();
            state.stats.deduplicated += 1;
            return Verdict::Accepted(id);
        }
        message.received_at = now;
        let id = message.id.clone();
        if let (Some(key), Some(window)) = (key, window) {
            state
                .seen
                .insert(&key, id.clone(), fingerprint, now + window);
        }
        state.deliveries.accepted(&message);
        // Its links are extracted by the scan's task, outside the lock.
        let to_scan = state
            .faults
            .link_scanner
            .then(|| (message.clone(), state.config.scan_origins.clone()));
        if state.messages.insert(message) {
            state.stats.duplicates += 1;
        }
        state.stats.delivered += 1;
        state.expire(now);
        self.arrived.notify_waiters();
        if let Some((to_scan, origins)) = to_scan {
            links::spawn_scan(self.clone(), id.clone(), to_scan, origins);
        }
        if state.faults.drop_after_accept > 0 {
            state.faults.drop_after_accept -= 1;
            state.stats.dropped += 1;
            return Verdict::AcceptedThenDrop(id);
        }
        Verdict::Accepted(id)
    }

    /// Sets the signing secrets (`whsec_…`, several during a rotation) of the endpoint `name`,
    /// replacing those it had (`PUT /webhooks/{name}/secrets`); an empty list forgets them (the
    /// resolver is asked again, if there is one). A secret that is not `whsec_` and base64 is
    /// the error and changes nothing. Secrets are never shown again: not by the read API, the
    /// pages, the logs nor `Debug`.
    pub fn set_webhook_secrets<S: AsRef<str>>(
        &self,
        name: &str,
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<(), SecretError> {
        let keys = secrets
            .into_iter()
            .map(|s| Key::parse(s.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut state = self.lock();
        if keys.is_empty() {
            state.webhook_keys.remove(name);
        } else {
            state.webhook_keys.insert(name.to_owned(), keys);
        }
        Ok(())
    }

    /// Asks `resolver` for the secrets of an endpoint name that has none set
    /// ([`Inbox::set_webhook_secrets`]), at every delivery to it, so that a rotation in the
    /// application shows at once (the dev server installs its endpoints' lookup). It answers
    /// the `whsec_…` secrets of the name, or an empty list: then the copy is accepted as
    /// unverified. Secrets it answers that cannot be used are skipped (a warning without them);
    /// if none can, the delivery is invalid ([`Problem::UnusableSecret`]).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// let inbox = oncely_inbox::Inbox::new().with_webhook_secrets_from(Arc::new(|name: &str| {
    ///     let secrets = if name == "app" { vec!["whsec_c2VjcmV0".to_owned()] } else { vec![] };
    ///     Box::pin(async move { secrets })
    /// }));
    /// ```
    ///
    /// Clones of an inbox share it: `inbox.clone().with_webhook_secrets_from(…)` installs it for
    /// every clone (an application that already serves the inbox's router can still install it).
    pub fn with_webhook_secrets_from(self, resolver: SecretsResolver) -> Self {
        self.lock().webhook_resolver = Some(resolver);
        self
    }

    /// The keys to check a delivery to `name` with: those set, else the resolver's.
    async fn webhook_keys(&self, name: &str) -> Result<Vec<Key>, Problem> {
        let resolver = {
            let state = self.lock();
            if let Some(keys) = state.webhook_keys.get(name) {
                return Ok(keys.clone());
            }
            state.webhook_resolver.clone()
        };
        let Some(resolver) = resolver else {
            return Ok(Vec::new());
        };
        let secrets = resolver(name).await;
        let mut unusable = 0;
        let keys: Vec<Key> = secrets
            .iter()
            .filter_map(|s| Key::parse(s).inspect_err(|_| unusable += 1).ok())
            .collect();
        if unusable > 0 {
            tracing::warn!(
                endpoint = name,
                unusable,
                "the webhook secrets resolver answered secrets that are not whsec_ and base64"
            );
            if keys.is_empty() {
                // Known to be signed, but not checkable: not "unverified".
                return Err(Problem::UnusableSecret);
            }
        }
        Ok(keys)
    }

    /// Answers one webhook delivery to `name` as `POST /webhooks/{name}` does: the injected
    /// delay ([`Faults::webhook_delay_ms`]), then a rejection if one is due (not kept), else
    /// the signature check against the name's secrets at the inbox's clock, and the copy kept
    /// with its verdict; an accepted copy may then be dropped
    /// ([`Faults::webhook_drop_after_accept`]).
    pub async fn receive_webhook(
        &self,
        name: &str,
        headers: WebhookHeaders,
        body: &[u8],
    ) -> WebhookVerdict {
        let delay = Duration::from_millis(self.lock().faults.webhook_delay_ms);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let keys = self.webhook_keys(name).await;
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        state.stats.webhooks.attempts += 1;
        if state.faults.webhook_reject_next > 0 {
            state.faults.webhook_reject_next -= 1;
            state.stats.webhooks.rejected += 1;
            return WebhookVerdict::Rejected(state.faults.webhook_reject_status);
        }
        let checked = keys.and_then(|keys| {
            if keys.is_empty() {
                return Ok(Verification::Unverified);
            }
            webhooks::verify(&keys, &headers, body, now).map(|()| Verification::Verified)
        });
        let (verdict, problem) = match checked {
            Ok(verdict) => (verdict, None),
            Err(problem) => (Verification::Invalid, Some(problem)),
        };
        let webhook = Webhook {
            id: uuid::Uuid::new_v4().to_string(),
            name: name.to_owned(),
            received_at: now,
            webhook_id: headers.id,
            timestamp: headers.timestamp,
            signature: headers.signature,
            verdict,
            problem,
            event_type: webhooks::event_type(body),
            body: String::from_utf8_lossy(body).into_owned(),
        };
        let id = webhook.id.clone();
        let duplicate = state.webhooks.insert(webhook);
        let stats = &mut state.stats.webhooks;
        stats.received += 1;
        match verdict {
            Verification::Invalid => stats.invalid += 1,
            Verification::Unverified => stats.unverified += 1,
            Verification::Verified => {}
        }
        if verdict != Verification::Invalid {
            if duplicate {
                stats.duplicates += 1;
            } else {
                stats.distinct += 1;
            }
        }
        state.expire(now);
        if let Some(problem) = problem {
            return WebhookVerdict::Invalid(id, problem);
        }
        if state.faults.webhook_drop_after_accept > 0 {
            state.faults.webhook_drop_after_accept -= 1;
            state.stats.webhooks.dropped += 1;
            return WebhookVerdict::AcceptedThenDrop(id);
        }
        WebhookVerdict::Accepted(id)
    }

    /// The kept webhook copies, newest first; of endpoint `name` if given (by index), of type
    /// `event_type` if given.
    pub fn webhooks(&self, name: Option<&str>, event_type: Option<&str>) -> Vec<Webhook> {
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        state.webhooks.list(name, event_type)
    }

    /// One webhook copy by the inbox's id.
    pub fn webhook(&self, id: &str) -> Option<Webhook> {
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        state.webhooks.get(id).cloned()
    }

    /// The newest webhook copies whose name, type or `webhook-id` contains `query` (ignoring
    /// case; empty: every copy), at most `limit`, newest first, each with how many kept
    /// accepted copies share its name and `webhook-id`; and how many match.
    pub fn search_webhooks(&self, query: &str, limit: usize) -> (Vec<(Webhook, usize)>, usize) {
        let query = query.trim().to_lowercase();
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        state.webhooks.search(&query, limit)
    }

    /// Each `webhook-id` delivered to endpoint `name` with how many kept accepted copies
    /// (verified or unverified) have it: an audit's view (every event id seen, how often).
    pub fn webhook_ids(&self, name: &str) -> std::collections::BTreeMap<String, usize> {
        let mut state = self.lock();
        let now = state.clock.now();
        state.expire(now);
        state.webhooks.ids(name)
    }

    /// Deletes every webhook copy (`DELETE /webhooks`); returns how many went. The counters and
    /// the secrets stay.
    pub fn delete_webhooks(&self) -> usize {
        let mut state = self.lock();
        let deleted = state.webhooks.len();
        state.webhooks.clear();
        deleted
    }

    /// Waits until `n` copies to endpoint `name` are kept, or `timeout` passes; returns what is
    /// there (newest first).
    pub async fn wait_for_webhooks(&self, name: &str, n: usize, timeout: Duration) -> Vec<Webhook> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = self.webhooks(Some(name), None);
            if found.len() >= n || Instant::now() >= deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
        to(key, "B@X.io")
    }

    fn to(key: Option<&str>, to: &str) -> Message {
        Message {
            id: String::new(),
            intake: Intake::Http,
            received_at: OffsetDateTime::UNIX_EPOCH,
            from: "a@x.io".into(),
            to: vec![to.into()],
            subject: "s".into(),
            text: "t".into(),
            html: None,
            reply_to: None,
            message_id: None,
            idempotency_key: key.map(Into::into),
            raw: String::new(),
        }
    }

    /// An inbox on a manual clock, keeping at most `max_messages` for `max_age`.
    fn bounded(max_messages: usize, max_age: Duration) -> (Inbox, Clock) {
        let clock = Clock::manual(OffsetDateTime::now_utc());
        let config = Config {
            retention: Retention {
                max_messages,
                max_age,
                ..Retention::default()
            },
            ..Config::default()
        };
        (Inbox::with_config(config).with_clock(clock.clone()), clock)
    }

    fn accepted(verdict: Verdict) -> String {
        match verdict {
            Verdict::Accepted(id) => id,
            other => panic!("not accepted: {other:?}"),
        }
    }

    fn subjects(messages: &[Message]) -> Vec<&str> {
        messages.iter().map(|m| m.subject.as_str()).collect()
    }

    fn numbered(n: usize, recipient: &str) -> Message {
        Message {
            subject: format!("m{n}"),
            ..to(Some(&format!("k{n}")), recipient)
        }
    }

    fn webhook(inbox: &Inbox, name: &str, id: &str) -> WebhookVerdict {
        let headers = WebhookHeaders {
            id: Some(id.to_owned()),
            ..WebhookHeaders::default()
        };
        let body = format!("{{\"type\":\"t.{id}\"}}");
        futures::executor::block_on(inbox.receive_webhook(name, headers, body.as_bytes()))
    }

    /// A log that a test can read.
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Log {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Secrets appear in no log line and no `Debug`, even those a resolver answers wrongly.
    #[test]
    fn no_secret_is_logged_or_shown_by_debug() {
        let good = "whsec_Z29vZC1zZWNyZXQtYnl0ZXM=";
        let bad = "whsec_bad*secret*text";
        let inbox = Inbox::new().with_webhook_secrets_from(Arc::new(move |name: &str| {
            let secrets = match name {
                "mixed" => vec![bad.to_owned(), good.to_owned()],
                _ => vec![bad.to_owned()],
            };
            Box::pin(async move { secrets })
        }));
        inbox.set_webhook_secrets("set", [good]).unwrap();
        let log = Log::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer({
                let log = log.clone();
                move || log.clone()
            })
            .finish();
        let verdicts = tracing::subscriber::with_default(subscriber, || {
            ["mixed", "broken", "set"].map(|name| {
                let headers = WebhookHeaders {
                    id: Some("m".into()),
                    timestamp: Some(inbox.lock().clock.now().unix_timestamp().to_string()),
                    signature: Some("v1,AAAA".into()),
                };
                let verdict =
                    futures::executor::block_on(inbox.receive_webhook(name, headers, b"{}"));
                format!("{verdict:?}")
            })
        });
        let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        assert!(log.contains("not whsec_ and base64"), "the warning: {log}");
        let shown = format!(
            "{log}{verdicts:?}{:?}{:?}{:?}",
            inbox.webhooks(None, None),
            inbox.stats(),
            inbox.faults()
        );
        assert!(shown.contains("unusable_secret") || shown.contains("UnusableSecret"));
        for secret in [good, bad] {
            assert!(!shown.contains(&secret[6..]), "{secret} in {shown}");
            assert!(!shown.contains(secret.trim_end_matches('=')), "{secret}");
        }
    }

    /// Webhooks are bounded like messages, by count and by age, and their indexes with them.
    #[test]
    fn the_oldest_webhooks_go_beyond_the_count_or_the_age_and_their_indexes_with_them() {
        let (inbox, clock) = bounded(3, Duration::from_secs(60));
        for n in 0..5 {
            let name = if n % 2 == 0 { "even" } else { "odd" };
            assert!(matches!(
                webhook(&inbox, name, &format!("w{n}")),
                WebhookVerdict::Accepted(_)
            ));
        }
        let ids = |name| -> Vec<String> {
            inbox
                .webhooks(name, None)
                .into_iter()
                .filter_map(|w| w.webhook_id)
                .collect()
        };
        assert_eq!(ids(None), ["w4", "w3", "w2"]);
        assert_eq!(ids(Some("even")), ["w4", "w2"]);
        assert_eq!(inbox.webhooks(None, Some("t.w3")).len(), 1);
        assert_eq!(inbox.stats().webhooks.evicted, 2);
        assert_eq!(inbox.lock().webhooks.index_sizes(), (2, 3, 3));
        // An evicted copy's webhook-id no longer makes a new copy a duplicate.
        webhook(&inbox, "even", "w0");
        assert_eq!(inbox.stats().webhooks.duplicates, 0);
        clock.advance(Duration::from_secs(60));
        assert!(inbox.webhooks(None, None).is_empty());
        assert_eq!(inbox.lock().webhooks.index_sizes(), (0, 0, 0));
        assert_eq!(inbox.stats().webhooks.evicted, 6);
        assert_eq!(inbox.lock().messages.len(), 0, "messages are another store");
    }

    /// Issue 21, item 2: runs keep a CI job's mail apart, and stay bounded.
    #[test]
    fn a_runs_mail_is_kept_apart_and_goes_with_it_and_runs_are_bounded() {
        let (inbox, clock) = bounded(3, Duration::from_secs(3600));
        let (a, b) = (inbox.create_run(), inbox.create_run());
        assert_ne!(a.run, b.run);
        inbox.receive(to(None, &format!("x@{}", a.domain.to_uppercase())));
        inbox.receive(to(None, &format!("y+{}@x.io", a.tag)));
        inbox.receive(to(None, &format!("x@{}", b.domain)));
        assert_eq!(inbox.run(&a.run).unwrap().messages, 2);
        assert_eq!(inbox.matching(None, Some(&b.run)).len(), 1);
        // What a wait counts is what it would answer, for every filter.
        let x_of = |d: &str| format!("x@{d}");
        for (to, run) in [
            (None, None),
            (Some(x_of(&a.domain)), None),
            (None, Some(a.run.clone())),
            (Some(x_of(&a.domain)), Some(a.run.clone())),
            (Some(x_of(&a.domain)), Some(b.run.clone())),
            (Some("nobody@x.io".to_owned()), None),
        ] {
            let (to, run) = (to.as_deref(), run.as_deref());
            assert_eq!(
                inbox.count_matching(to, run),
                inbox.matching(to, run).len(),
                "{to:?} {run:?}"
            );
        }
        let x_of_a = inbox.matching(Some(&format!("X@{}", a.domain)), Some(&a.run));
        assert_eq!(x_of_a.len(), 1, "to and run together");
        assert_eq!(
            inbox
                .matching(Some(&format!("x@{}", a.domain)), Some(&b.run))
                .len(),
            0
        );
        assert_eq!(inbox.delete_run(&a.run), Some(2));
        assert_eq!((inbox.run(&a.run), inbox.delete_run(&a.run)), (None, None));
        assert_eq!(
            inbox.matching(None, Some(&b.run)).len(),
            1,
            "b keeps its mail"
        );
        // A message to two runs: deleting one run leaves it to the other.
        let c = inbox.create_run();
        let mut both = to(None, &format!("x@{}", b.domain));
        both.to.push(format!("y@{}", c.domain));
        inbox.receive(both);
        assert_eq!(inbox.delete_run(&c.run), Some(0), "shared with b: kept");
        assert_eq!(inbox.matching(None, Some(&b.run)).len(), 2);
        for n in 0..3 {
            inbox.receive(numbered(n, "z@x.io"));
        }
        assert_eq!(
            inbox.lock().messages.run_index_sizes(),
            (0, 0),
            "evicted, unindexed"
        );
        clock.advance(Duration::from_secs(3600));
        assert!(
            inbox.run(&b.run).is_none(),
            "forgotten after the retention's age"
        );
        let first = inbox.create_run();
        for _ in 0..runs::MAX_RUNS {
            inbox.create_run();
        }
        assert!(inbox.run(&first.run).is_none());
        assert_eq!(inbox.runs().len(), runs::MAX_RUNS);
        inbox.clear();
        assert!(inbox.runs().is_empty(), "a full reset forgets them");
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
        let first = accepted(inbox.receive(message(Some("k"))));
        assert_eq!(inbox.receive(message(Some("k"))), Verdict::Accepted(first));
        assert_eq!(inbox.messages(None).len(), 1);
        assert_eq!(inbox.stats().deduplicated, 1);
    }

    #[test]
    fn provider_mode_refuses_a_known_key_with_another_message() {
        let inbox = Inbox::new();
        inbox.set_faults(Faults::provider());
        accepted(inbox.receive(message(Some("k"))));
        for other in [
            to(Some("k"), "someone-else@x.io"),
            Message {
                text: "another link".into(),
                ..message(Some("k"))
            },
            Message {
                from: "another-sender@x.io".into(),
                ..message(Some("k"))
            },
            Message {
                html: Some("<p>t</p>".into()),
                ..message(Some("k"))
            },
            Message {
                reply_to: Some("elsewhere@x.io".into()),
                ..message(Some("k"))
            },
        ] {
            assert_eq!(
                inbox.receive(other),
                Verdict::Conflict(Conflict::InvalidIdempotentRequest)
            );
        }
        // The recipient's case is not a difference: addresses are kept in lower case.
        assert!(matches!(
            inbox.receive(to(Some("k"), "b@x.IO")),
            Verdict::Accepted(_)
        ));
        let stats = inbox.stats();
        assert_eq!(
            (stats.mismatched, stats.deduplicated, stats.delivered),
            (5, 1, 1)
        );
        assert_eq!(inbox.messages(None).len(), 1);
    }

    #[tokio::test]
    async fn provider_mode_refuses_a_key_still_in_flight_in_another_request() {
        let inbox = Inbox::new();
        inbox.set_faults(Faults {
            delay_ms: 300,
            ..Faults::provider()
        });
        let first = tokio::spawn({
            let inbox = inbox.clone();
            async move { inbox.attempt(message(Some("k"))).await }
        });
        // The first request holds its key through its delay.
        while inbox.lock().in_flight.is_empty() {
            tokio::task::yield_now().await;
        }
        let (second, other_key) = tokio::join!(
            inbox.attempt(message(Some("k"))),
            inbox.attempt(message(Some("other")))
        );
        assert_eq!(
            second,
            Verdict::Conflict(Conflict::ConcurrentIdempotentRequests)
        );
        assert!(matches!(other_key, Verdict::Accepted(_)), "other keys pass");
        let first = accepted(first.await.unwrap());
        assert_eq!(
            inbox.attempt(message(Some("k"))).await,
            Verdict::Accepted(first),
            "once answered, a repeat is deduplicated"
        );
        assert_eq!(inbox.stats().concurrent, 1);
        assert!(inbox.lock().in_flight.is_empty());
    }

    #[tokio::test]
    async fn outside_provider_mode_concurrent_copies_are_all_kept() {
        let inbox = Inbox::new();
        inbox.set_faults(Faults {
            delay_ms: 100,
            ..Faults::default()
        });
        let (a, b) = tokio::join!(
            inbox.attempt(message(Some("k"))),
            inbox.attempt(message(Some("k")))
        );
        assert!(matches!(
            (a, b),
            (Verdict::Accepted(_), Verdict::Accepted(_))
        ));
        assert_eq!(inbox.stats().duplicates, 1);
    }

    #[test]
    fn the_oldest_messages_go_beyond_the_count_and_their_indexes_with_them() {
        let (inbox, _clock) = bounded(3, Duration::from_secs(3600));
        let ids: Vec<String> = (0..5)
            .map(|n| {
                accepted(inbox.receive(numbered(
                    n,
                    if n % 2 == 0 { "even@x.io" } else { "odd@x.io" },
                )))
            })
            .collect();
        assert_eq!(subjects(&inbox.messages(None)), ["m2", "m3", "m4"]);
        assert_eq!(subjects(&inbox.messages(Some("even@x.io"))), ["m2", "m4"]);
        assert_eq!(subjects(&inbox.messages(Some("ODD@x.io"))), ["m3"]);
        assert!(inbox.message(&ids[0]).is_none());
        assert_eq!(inbox.message(&ids[4]).unwrap().subject, "m4");
        assert_eq!(inbox.stats().evicted, 2);
        assert_eq!(inbox.lock().messages.index_sizes(), (2, 3, 3));
        // An evicted copy's key no longer makes a new copy a duplicate.
        inbox.receive(numbered(0, "even@x.io"));
        assert_eq!(inbox.stats().duplicates, 0);
    }

    /// An inbox keeping at most `max_bytes` (and 100 messages, an hour).
    fn budget(max_bytes: usize) -> (Inbox, Clock) {
        let clock = Clock::manual(OffsetDateTime::now_utc());
        let config = Config {
            retention: Retention {
                max_messages: 100,
                max_age: Duration::from_secs(3600),
                max_bytes,
            },
            ..Config::default()
        };
        (Inbox::with_config(config).with_clock(clock.clone()), clock)
    }

    /// Message `n` with a text part of `len` bytes, its source as long again.
    fn sized(n: usize, len: usize) -> Message {
        Message {
            text: "x".repeat(len),
            raw: "r".repeat(len),
            ..numbered(n, "a@x.io")
        }
    }

    /// Issue 36, item 4: 300 messages of 1.9 MB took the inbox to 1.16 GB, whatever it was
    /// asked to keep. What it holds of its messages is bounded in bytes: the oldest go first
    /// (their delivery keys stay), and the count holds it to the budget.
    #[test]
    fn the_oldest_messages_go_beyond_the_byte_budget_and_their_delivery_keys_stay() {
        let one = messages::kept_size(&Message {
            id: uuid::Uuid::new_v4().to_string(),
            ..sized(0, 10_000)
        });
        assert!(one > 20_000, "the source and the text both count: {one}");
        let (inbox, _clock) = budget(3 * one + one / 2);
        let ids: Vec<String> = (0..6)
            .map(|n| accepted(inbox.receive(sized(n, 10_000))))
            .collect();
        assert_eq!(subjects(&inbox.messages(None)), ["m3", "m4", "m5"]);
        assert!(inbox.message(&ids[0]).is_none());
        assert_eq!(inbox.stats().evicted, 3);
        assert!(inbox.lock().messages.bytes() <= 3 * one + one / 2);
        let first = inbox.delivery("k0");
        assert!(
            first.accepted && first.first_id.as_deref() == Some(ids[0].as_str()),
            "an evicted message's key still answers: {first:?}"
        );
        // Every way out gives its bytes back.
        inbox.delete(&ids[3..4]);
        assert_eq!(inbox.lock().messages.bytes(), 2 * one);
        inbox.delete_all();
        assert_eq!(inbox.lock().messages.bytes(), 0);
    }

    /// One budget covers the messages and the webhooks: the older goes first, whichever it is.
    #[test]
    fn messages_and_webhooks_share_the_byte_budget_oldest_first() {
        let one = messages::kept_size(&Message {
            id: uuid::Uuid::new_v4().to_string(),
            ..sized(0, 10_000)
        });
        let (inbox, clock) = budget(3 * one);
        let body = format!("{{\"type\":\"t\",\"pad\":\"{}\"}}", "p".repeat(15_000));
        let hook = WebhookHeaders {
            id: Some("w1".into()),
            ..WebhookHeaders::default()
        };
        futures::executor::block_on(inbox.receive_webhook("app", hook, body.as_bytes()));
        assert!(inbox.lock().webhooks.bytes() > body.len());
        clock.advance(Duration::from_secs(1));
        for n in 0..2 {
            accepted(inbox.receive(sized(n, 10_000)));
        }
        assert_eq!(inbox.webhooks(None, None).len(), 1, "all three fit");
        accepted(inbox.receive(sized(2, 10_000)));
        assert!(inbox.webhooks(None, None).is_empty(), "the oldest went");
        assert_eq!(subjects(&inbox.messages(None)), ["m0", "m1", "m2"]);
        assert_eq!(inbox.stats().webhooks.evicted, 1);
        assert_eq!(inbox.lock().webhooks.bytes(), 0);
    }

    /// A message that alone would take more than the budget is refused, not kept (nor its key
    /// remembered), and consumes no fault; the intakes answer 413 / 552.
    #[test]
    fn a_message_larger_than_the_whole_budget_is_refused_before_any_fault() {
        let (inbox, _clock) = budget(30_000);
        inbox.set_faults(Faults {
            reject_next: 1,
            ..Faults::default()
        });
        assert_eq!(inbox.receive(sized(0, 20_000)), Verdict::TooLarge);
        assert_eq!(inbox.faults().reject_next, 1, "no fault consumed");
        assert!(inbox.messages(None).is_empty());
        assert!(!inbox.delivery("k0").accepted);
        let stats = inbox.stats();
        assert_eq!((stats.too_large, stats.delivered), (1, 0));
        assert_eq!(
            inbox.receive(sized(1, 1_000)),
            Verdict::Rejected(Rejection::Temporary)
        );
        accepted(inbox.receive(sized(2, 1_000)));
    }

    /// What one message may be as sent follows the budget: 10 MiB, at most a quarter of it.
    #[test]
    fn the_largest_message_is_ten_mebibytes_and_a_quarter_of_the_budget_at_most() {
        let of = |max_bytes| {
            Retention {
                max_bytes,
                ..Retention::default()
            }
            .max_message_bytes()
        };
        assert_eq!(Retention::default().max_bytes, 256 * 1024 * 1024);
        assert_eq!(of(DEFAULT_MAX_BYTES), MAX_MESSAGE_BYTES);
        assert_eq!(MAX_MESSAGE_BYTES, 10 * 1024 * 1024);
        assert_eq!(of(4 * 1024 * 1024), 1024 * 1024);
        assert_eq!(of(0), 0);
    }

    #[test]
    fn messages_older_than_the_retention_go_first() {
        let (inbox, clock) = bounded(100, Duration::from_secs(60));
        inbox.receive(numbered(0, "a@x.io"));
        clock.advance(Duration::from_secs(30));
        let young = accepted(inbox.receive(numbered(1, "a@x.io")));
        clock.advance(Duration::from_secs(30));
        assert_eq!(subjects(&inbox.messages(Some("a@x.io"))), ["m1"]);
        clock.advance(Duration::from_secs(29));
        assert_eq!(inbox.message(&young).unwrap().subject, "m1");
        clock.advance(Duration::from_secs(1));
        assert!(inbox.message(&young).is_none());
        assert!(inbox.messages(None).is_empty());
        assert_eq!(inbox.stats().evicted, 2);
        assert_eq!(inbox.lock().messages.index_sizes(), (0, 0, 0));
    }

    /// Issue 15, item 7: the page's search, newest first, bounded, with each copy's count.
    #[test]
    fn a_search_matches_sender_recipient_or_subject_newest_first_and_counts_copies() {
        let inbox = Inbox::new();
        for n in 0..5 {
            inbox.receive(numbered(n, if n < 3 { "Ada@x.io" } else { "bob@x.io" }));
        }
        inbox.receive(Message {
            subject: "m1 again".into(),
            ..to(Some("k1"), "carol@x.io")
        });
        let subjects = |found: &Found| -> Vec<(String, usize)> {
            found
                .messages
                .iter()
                .map(|(m, copies)| (m.subject.clone(), *copies))
                .collect()
        };
        let ada = inbox.search(" ADA@", 2);
        assert_eq!(ada.matching, 3);
        assert_eq!(
            subjects(&ada),
            [("m2".to_owned(), 1), ("m1".to_owned(), 2)],
            "newest first, at most 2; m1 has a copy under its key"
        );
        let by_subject = inbox.search("AGAIN", 10);
        assert_eq!(subjects(&by_subject), [("m1 again".to_owned(), 2)]);
        assert_eq!(inbox.search("a@x.io", 10).matching, 6, "the sender");
        assert_eq!(inbox.search("", 10).matching, 6);
        assert_eq!(
            inbox.search("nobody", 10),
            Found {
                messages: vec![],
                matching: 0
            }
        );
    }

    #[test]
    fn deleting_by_id_updates_every_index() {
        let inbox = Inbox::new();
        let a = accepted(inbox.receive(to(Some("k"), "a@x.io")));
        let b = accepted(inbox.receive(to(Some("k"), "a@x.io")));
        let c = accepted(inbox.receive(to(None, "c@x.io")));
        assert_eq!(inbox.delete(&[a.clone(), "unknown".into()]), 1);
        assert!(inbox.message(&a).is_none());
        assert_eq!(inbox.messages(Some("a@x.io"))[0].id, b);
        assert_eq!(inbox.delete(&[b, c]), 2);
        assert!(inbox.messages(Some("a@x.io")).is_empty());
        assert_eq!(inbox.lock().messages.index_sizes(), (0, 0, 0));
        assert_eq!(inbox.stats().delivered, 3, "counters stay");
    }

    #[test]
    fn provider_mode_forgets_a_key_when_its_window_ends() {
        let (inbox, clock) = bounded(100, Duration::from_secs(3600));
        inbox.set_faults(Faults {
            dedupe_window_ms: Some(1000),
            ..Faults::default()
        });
        let first = accepted(inbox.receive(message(Some("k"))));
        clock.advance(Duration::from_millis(999));
        assert_eq!(
            inbox.receive(message(Some("k"))),
            Verdict::Accepted(first.clone())
        );
        assert_eq!(inbox.lock().seen.len(), 1);
        clock.advance(Duration::from_millis(1));
        assert_eq!(inbox.lock().seen.len(), 1, "forgotten when next looked at");
        assert_eq!(inbox.stats().deduplicated, 1);
        assert_eq!(inbox.lock().seen.len(), 0);
        let again = accepted(inbox.receive(message(Some("k"))));
        assert_ne!(again, first, "after the window the key delivers again");
        assert_eq!(inbox.messages(None).len(), 2);
    }

    /// Review of issue 14, B: setting faults without a window forgot every seen key.
    #[test]
    fn no_change_of_faults_forgets_a_seen_key() {
        let inbox = Inbox::new();
        inbox.set_faults(Faults::provider());
        let first = accepted(inbox.receive(message(Some("k"))));
        inbox.set_faults(Faults::default());
        assert!(
            matches!(inbox.receive(to(Some("k"), "other@x.io")), Verdict::Accepted(id) if id != first),
            "provider mode off: no deduplication"
        );
        inbox.set_faults(Faults::provider());
        assert_eq!(
            inbox.receive(to(Some("k"), "other@x.io")),
            Verdict::Conflict(Conflict::InvalidIdempotentRequest),
            "on again, the key is known with its first message"
        );
        assert_eq!(inbox.receive(message(Some("k"))), Verdict::Accepted(first));
        inbox.clear();
        assert!(
            matches!(
                inbox.receive(to(Some("k"), "other@x.io")),
                Verdict::Accepted(_)
            ),
            "a full reset forgets it"
        );
    }

    /// Second review of issue 14: a key was measured against the window in force when it was
    /// looked at, so shortening the window (even for a moment) forgot keys a provider had
    /// promised to remember, and the key then took another payload.
    #[test]
    fn a_key_is_remembered_for_the_window_in_force_when_it_was_seen() {
        let clock = Clock::manual(OffsetDateTime::UNIX_EPOCH + Duration::from_secs(1_000_000));
        let inbox = Inbox::new().with_clock(clock.clone());
        inbox.set_faults(Faults::provider());
        accepted(inbox.receive(message(Some("k1"))));
        inbox.set_faults(Faults {
            dedupe_window_ms: Some(1),
            ..Faults::default()
        });
        clock.advance(Duration::from_millis(10));
        assert_eq!(
            inbox.receive(to(Some("k1"), "two@x.io")),
            Verdict::Conflict(Conflict::InvalidIdempotentRequest),
            "still within the 24 h it was seen under"
        );
        // A key seen under the short window is forgotten after it.
        accepted(inbox.receive(message(Some("k2"))));
        clock.advance(Duration::from_millis(10));
        assert!(matches!(
            inbox.receive(to(Some("k2"), "two@x.io")),
            Verdict::Accepted(_)
        ));
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

    #[test]
    fn throttling_answers_the_next_attempts_and_then_every_nth() {
        let inbox = Inbox::new();
        inbox.set_faults(Faults {
            throttle_next: 2,
            retry_after_s: 120,
            ..Faults::default()
        });
        let verdicts: Vec<_> = (0..3).map(|_| inbox.receive(message(None))).collect();
        assert_eq!(
            verdicts[..2],
            [Verdict::Throttled(120), Verdict::Throttled(120)]
        );
        assert!(matches!(verdicts[2], Verdict::Accepted(_)));
        inbox.set_faults(Faults {
            throttle_every: 3,
            ..Faults::default()
        });
        let throttled: Vec<bool> = (0..6)
            .map(|_| matches!(inbox.receive(message(None)), Verdict::Throttled(1)))
            .collect();
        assert_eq!(throttled, [false, false, true, false, false, true]);
        assert_eq!(inbox.stats().throttled, 4);
        assert_eq!(inbox.messages(None).len(), 5);
    }

    #[test]
    fn credentials_are_refused_for_the_next_attempts_or_for_a_period() {
        let (inbox, clock) = bounded(100, Duration::from_secs(3600));
        inbox.set_faults(Faults {
            unauthorized_next: 1,
            ..Faults::default()
        });
        assert_eq!(inbox.receive(message(None)), Verdict::Unauthorized);
        assert!(matches!(inbox.receive(message(None)), Verdict::Accepted(_)));
        inbox.set_faults(Faults {
            unauthorized_for_ms: 5000,
            ..Faults::default()
        });
        clock.advance(Duration::from_millis(4000));
        assert_eq!(inbox.receive(message(None)), Verdict::Unauthorized);
        assert_eq!(inbox.faults().unauthorized_for_ms, 1000, "what remains");
        // Setting what was read back keeps the period's end (the chaos run's read-modify-write).
        inbox.set_faults(inbox.faults());
        clock.advance(Duration::from_millis(1000));
        assert!(matches!(inbox.receive(message(None)), Verdict::Accepted(_)));
        assert_eq!(inbox.faults().unauthorized_for_ms, 0);
        assert_eq!(inbox.stats().unauthorized, 2);
    }
}
