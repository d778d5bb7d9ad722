//! What the inbox keeps: the messages in arrival order with their indexes (by id, by recipient,
//! by key), bounded by count, age and bytes; and, in provider mode, the idempotency keys seen
//! within the window. No request scans every message.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::Message;
use crate::links::Scan;
use crate::runs::run_of;

/// How much the inbox keeps: the oldest messages go first, when there are more than
/// `max_messages`, when they are older than `max_age`, or when what the inbox holds of them
/// (and of the webhooks it received) would take more than `max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// The most messages kept.
    pub max_messages: usize,
    /// How long a message is kept.
    pub max_age: Duration,
    /// The most bytes the kept messages and webhooks take, counted as the inbox holds them
    /// ([`kept_size`]: a message's source, its decoded text and HTML parts, its headers and
    /// addresses, what the link scanner recorded, and a fixed amount per entry for its indexes;
    /// a webhook's body and headers). Beyond it the oldest go first; one message that alone
    /// would take more is refused (HTTP 413, SMTP 552), as is one larger than
    /// [`Retention::max_message_bytes`] as sent. 0 keeps nothing and refuses every message.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: usize,
}

/// The default byte budget: 256 MiB, which a CI container has to spare.
pub const DEFAULT_MAX_BYTES: usize = 256 * 1024 * 1024;

/// The largest message either intake takes as sent (an SMTP DATA section, a `POST /emails`
/// body), whatever the budget: 10 MiB.
pub const MAX_MESSAGE_BYTES: usize = 10 * 1024 * 1024;

/// The most recipients one message may have, whichever the intake: 1,000 (RFC 5321 has an SMTP
/// server take at least 100; Resend takes 50). SMTP answers `452 4.5.3` to a `RCPT TO` beyond
/// it, HTTP 422 `validation_error`. (What they take in bytes counts against the message's size:
/// [`Retention::max_message_bytes`].)
pub const MAX_RECIPIENTS: usize = 1_000;

fn default_max_bytes() -> usize {
    DEFAULT_MAX_BYTES
}

impl Default for Retention {
    /// 10,000 messages, 24 hours, 256 MiB.
    fn default() -> Self {
        Self {
            max_messages: 10_000,
            max_age: Duration::from_secs(24 * 60 * 60),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

impl Retention {
    /// The largest message either intake takes as sent: [`MAX_MESSAGE_BYTES`], and at most a
    /// quarter of [`Retention::max_bytes`] (what the inbox keeps of a message — its source and
    /// its decoded parts — is often about twice what was sent, up to about nine times for a body
    /// whose every byte becomes a 3-byte character in the source, the text and the HTML; the
    /// budget counts what is kept, and refuses a message that alone would exceed it). SMTP
    /// advertises it (`SIZE`) and answers 552 beyond it; HTTP answers 413.
    pub fn max_message_bytes(&self) -> usize {
        MAX_MESSAGE_BYTES.min(self.max_bytes / 4)
    }
}

/// What the inbox is taken to hold per kept message or webhook beyond its strings: the entry
/// itself and its places in the indexes.
const ENTRY_OVERHEAD: usize = 512;

/// What a string-keyed index (by recipient, by run) is taken to hold per entry beyond its key's
/// bytes: the key's own allocation, the hash table's slot with its spare room (up to half the
/// table after it grows), the set of arrivals and its tree node (about 110 bytes for one). Its
/// full size even when another message shares the entry: generous, never under.
const INDEX_ENTRY_OVERHEAD: usize = 256;

/// What a kept string is taken to hold beyond its bytes: its header and the allocator's
/// rounding.
const STRING_OVERHEAD: usize = 32;

/// What the link scanner's record of one link is taken to hold beyond its strings.
const SCAN_OVERHEAD: usize = 64;

/// What the inbox holds per recipient `to` of a message: the address in the message, and its
/// entry in the recipient index ([`INDEX_ENTRY_OVERHEAD`]).
fn recipient_size(to: &str) -> usize {
    STRING_OVERHEAD + to.len() + INDEX_ENTRY_OVERHEAD + to.len()
}

/// What the inbox holds for `message`, in bytes, as the byte budget counts it
/// ([`Retention::max_bytes`]): every string it keeps (the source, the text and HTML parts, the
/// sender, recipients, subject, `Reply-To`, `Message-ID`, the idempotency key), the copies of
/// its id and key the indexes hold, each recipient's entry in the recipient index and each run
/// its recipients name in the run index ([`INDEX_ENTRY_OVERHEAD`] each, with the key), and
/// [`ENTRY_OVERHEAD`]. (Its links are not kept:
/// they are extracted when asked for; what the scanner did with them is counted when recorded:
/// [`scans_size`].)
pub(crate) fn kept_size(message: &Message) -> usize {
    let optional = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    ENTRY_OVERHEAD
        + 2 * message.id.len()
        + message.from.len()
        + message
            .to
            .iter()
            .map(|to| recipient_size(to))
            .sum::<usize>()
        + runs_of(message)
            .into_iter()
            .map(|run| INDEX_ENTRY_OVERHEAD + run.len())
            .sum::<usize>()
        + message.subject.len()
        + message.text.len()
        + optional(&message.html)
        + optional(&message.reply_to)
        + 2 * optional(&message.message_id)
        + 2 * optional(&message.idempotency_key)
        + message.raw.len()
}

/// What the link scanner's record of one message holds, in bytes.
pub(crate) fn scans_size(scans: &[Scan]) -> usize {
    scans
        .iter()
        .map(|s| SCAN_OVERHEAD + s.url.len() + s.error.as_ref().map_or(0, String::len))
        .sum()
}

/// What the inbox holds for a webhook copy, in bytes: its strings, its name and `webhook-id`
/// again as index keys, and [`ENTRY_OVERHEAD`].
pub(crate) fn webhook_size(webhook: &crate::Webhook) -> usize {
    let optional = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    ENTRY_OVERHEAD
        + 2 * webhook.id.len()
        + 2 * webhook.name.len()
        + 2 * optional(&webhook.webhook_id)
        + optional(&webhook.timestamp)
        + optional(&webhook.signature)
        + optional(&webhook.event_type)
        + webhook.body.len()
}

/// An entry kept in arrival order (a message, a webhook copy).
pub(crate) trait Received {
    /// When the inbox received it.
    fn received_at(&self) -> OffsetDateTime;
}

impl Received for Message {
    fn received_at(&self) -> OffsetDateTime {
        self.received_at
    }
}

/// What is kept in arrival order (messages, webhook copies) and dropped oldest first beyond a
/// [`Retention`].
pub(crate) trait ByArrival {
    /// What is kept.
    type Entry: Received;
    /// The kept entries by arrival number.
    fn by_arrival(&self) -> &BTreeMap<u64, Self::Entry>;
    /// How many bytes the kept entries take, as the byte budget counts them.
    fn bytes(&self) -> usize;
    /// Forgets the entry of `arrival` (and its indexes).
    fn remove_arrival(&mut self, arrival: u64);

    /// The oldest entry's arrival number and when it was received.
    fn oldest(&self) -> Option<(u64, OffsetDateTime)> {
        let (&arrival, entry) = self.by_arrival().first_key_value()?;
        Some((arrival, entry.received_at()))
    }

    /// How many entries are kept.
    fn kept(&self) -> usize {
        self.by_arrival().len()
    }

    /// Drops the oldest entries beyond `retention`'s count and age at `now`; returns how many.
    /// (The byte budget covers messages and webhooks together: `State::expire`.)
    fn evict(&mut self, retention: &Retention, now: OffsetDateTime) -> u64 {
        let mut evicted = 0;
        while let Some((arrival, received_at)) = self.oldest() {
            let too_many = self.kept() > retention.max_messages;
            if !too_many && received_at + retention.max_age > now {
                break;
            }
            self.remove_arrival(arrival);
            evicted += 1;
        }
        evicted
    }
}

/// The kept messages and their indexes.
#[derive(Default)]
pub(crate) struct Messages {
    /// Arrival number of the next message.
    next: u64,
    /// Every kept message by arrival number: oldest first.
    by_arrival: BTreeMap<u64, Message>,
    by_id: HashMap<String, u64>,
    /// Recipient (lower case) → arrivals.
    by_to: HashMap<String, BTreeSet<u64>>,
    /// Duplicate key (idempotency key, else `Message-ID`) → arrivals.
    by_key: HashMap<String, BTreeSet<u64>>,
    /// Run a recipient names ([`crate::runs`]) → arrivals.
    by_run: HashMap<String, BTreeSet<u64>>,
    /// What the link scanner did with each message's links, by arrival (when it has finished).
    scans: HashMap<u64, Vec<Scan>>,
    /// What the kept messages and their scans take ([`kept_size`], [`scans_size`]).
    bytes: usize,
}

/// The runs `message`'s recipients name, each once.
fn runs_of(message: &Message) -> BTreeSet<&str> {
    message.to.iter().filter_map(|to| run_of(to)).collect()
}

/// What counts two copies as the same message in normal mode: the idempotency key the intake
/// reads, else the `Message-ID`.
fn duplicate_key(message: &Message) -> Option<&str> {
    message
        .idempotency_key
        .as_deref()
        .or(message.message_id.as_deref())
}

impl Messages {
    /// Keeps `message`; `true` if a kept copy already had its duplicate key. Its large strings
    /// are shrunk to their length: what is counted is what is held.
    pub(crate) fn insert(&mut self, mut message: Message) -> bool {
        message.raw.shrink_to_fit();
        message.text.shrink_to_fit();
        if let Some(html) = message.html.as_mut() {
            html.shrink_to_fit();
        }
        self.bytes += kept_size(&message);
        let arrival = self.next;
        self.next += 1;
        let mut duplicate = false;
        if let Some(key) = duplicate_key(&message) {
            let copies = self.by_key.entry(key.to_owned()).or_default();
            duplicate = !copies.is_empty();
            copies.insert(arrival);
        }
        for to in &message.to {
            self.by_to.entry(to.clone()).or_default().insert(arrival);
        }
        for run in runs_of(&message) {
            self.by_run
                .entry(run.to_owned())
                .or_default()
                .insert(arrival);
        }
        self.by_id.insert(message.id.clone(), arrival);
        self.by_arrival.insert(arrival, message);
        duplicate
    }

    /// One message by id.
    pub(crate) fn get(&self, id: &str) -> Option<&Message> {
        self.by_id.get(id).and_then(|a| self.by_arrival.get(a))
    }

    /// Every message, oldest first; only those to `to` (lower case) if given.
    pub(crate) fn list(&self, to: Option<&str>) -> Vec<Message> {
        match to {
            None => self.by_arrival.values().cloned().collect(),
            Some(to) => self.by_to.get(to).map_or_else(Vec::new, |arrivals| {
                arrivals
                    .iter()
                    .filter_map(|a| self.by_arrival.get(a))
                    .cloned()
                    .collect()
            }),
        }
    }

    /// The messages to `to` (lower case) and of `run`, whichever are given (both: those of the
    /// run to `to`), oldest first.
    pub(crate) fn matching(&self, to: Option<&str>, run: Option<&str>) -> Vec<Message> {
        let arrivals = |index: &HashMap<String, BTreeSet<u64>>, key: &str| {
            index.get(key).cloned().unwrap_or_default()
        };
        let chosen = match (to, run) {
            (None, None) => return self.list(None),
            (Some(to), None) => arrivals(&self.by_to, to),
            (None, Some(run)) => arrivals(&self.by_run, run),
            (Some(to), Some(run)) => {
                let of_run = arrivals(&self.by_run, run);
                arrivals(&self.by_to, to)
                    .intersection(&of_run)
                    .copied()
                    .collect()
            }
        };
        chosen
            .iter()
            .filter_map(|a| self.by_arrival.get(a))
            .cloned()
            .collect()
    }

    /// How many messages [`Messages::matching`] would give, without copying one.
    pub(crate) fn count_matching(&self, to: Option<&str>, run: Option<&str>) -> usize {
        let len = |index: &HashMap<String, BTreeSet<u64>>, key: &str| {
            index.get(key).map_or(0, BTreeSet::len)
        };
        match (to, run) {
            (None, None) => self.by_arrival.len(),
            (Some(to), None) => len(&self.by_to, to),
            (None, Some(run)) => len(&self.by_run, run),
            (Some(to), Some(run)) => match (self.by_to.get(to), self.by_run.get(run)) {
                (Some(of_to), Some(of_run)) => of_to.intersection(of_run).count(),
                _ => 0,
            },
        }
    }

    /// How many kept messages are of `run`.
    pub(crate) fn count_run(&self, run: &str) -> usize {
        self.by_run.get(run).map_or(0, BTreeSet::len)
    }

    /// Records what the link scanner did with the links of message `id`, if it is still kept.
    pub(crate) fn set_scans(&mut self, id: &str, scans: Vec<Scan>) {
        if let Some(&arrival) = self.by_id.get(id) {
            self.bytes += scans_size(&scans);
            if let Some(old) = self.scans.insert(arrival, scans) {
                self.bytes -= scans_size(&old);
            }
        }
    }

    /// What the link scanner did with the links of message `id`, once it has finished.
    pub(crate) fn scans(&self, id: &str) -> Option<&Vec<Scan>> {
        self.by_id.get(id).and_then(|a| self.scans.get(a))
    }

    /// The newest messages that `query` matches, at most `limit`, newest first, each with how
    /// many kept copies share its duplicate key (1: no other); and how many match in all. The
    /// query (lower case) matches a substring of the sender, a recipient or the subject,
    /// ignoring case; empty, every message. (It scans the kept messages, cloning only those
    /// shown: a page for a person, not a hot path.)
    pub(crate) fn search(&self, query: &str, limit: usize) -> (Vec<(Message, usize)>, usize) {
        let matches = |m: &Message| {
            query.is_empty()
                || m.subject.to_lowercase().contains(query)
                || m.from.to_lowercase().contains(query)
                || m.to.iter().any(|to| to.contains(query))
        };
        let mut shown = Vec::new();
        let mut matching = 0;
        for message in self.by_arrival.values().rev().filter(|m| matches(m)) {
            matching += 1;
            if shown.len() < limit {
                shown.push((message.clone(), self.copies(message)));
            }
        }
        (shown, matching)
    }

    /// How many kept copies share `message`'s duplicate key (1 if it has none).
    pub(crate) fn copies(&self, message: &Message) -> usize {
        duplicate_key(message)
            .and_then(|key| self.by_key.get(key))
            .map_or(1, BTreeSet::len)
    }

    /// How many are kept.
    pub(crate) fn len(&self) -> usize {
        self.by_arrival.len()
    }

    /// Deletes one message by id; `false` if there is none.
    pub(crate) fn remove(&mut self, id: &str) -> bool {
        match self.by_id.get(id) {
            Some(&arrival) => {
                self.forget(arrival);
                true
            }
            None => false,
        }
    }

    /// Forgets everything.
    pub(crate) fn clear(&mut self) {
        *self = Self {
            next: self.next,
            ..Self::default()
        };
    }

    /// Deletes the messages of `run` that belong to no other run; a message also addressed to
    /// another run stays there (it leaves only this run's index). How many went.
    pub(crate) fn delete_run(&mut self, run: &str) -> usize {
        let arrivals = self.by_run.remove(run).unwrap_or_default();
        let mut deleted = 0;
        for arrival in arrivals {
            let shared = self
                .by_arrival
                .get(&arrival)
                .is_some_and(|message| runs_of(message).into_iter().any(|r| r != run));
            if !shared {
                self.forget(arrival);
                deleted += 1;
            }
        }
        deleted
    }

    fn forget(&mut self, arrival: u64) {
        let Some(message) = self.by_arrival.remove(&arrival) else {
            return;
        };
        self.bytes -= kept_size(&message);
        self.by_id.remove(&message.id);
        for to in &message.to {
            unindex(&mut self.by_to, to, arrival);
        }
        for run in runs_of(&message) {
            unindex(&mut self.by_run, run, arrival);
        }
        if let Some(scans) = self.scans.remove(&arrival) {
            self.bytes -= scans_size(&scans);
        }
        if let Some(key) = duplicate_key(&message) {
            unindex(&mut self.by_key, key, arrival);
        }
    }

    /// Index sizes (recipients, keys, ids), for tests of their upkeep.
    #[cfg(test)]
    pub(crate) fn index_sizes(&self) -> (usize, usize, usize) {
        (self.by_to.len(), self.by_key.len(), self.by_id.len())
    }

    /// How many runs the run index holds, and how many scans are recorded, for tests of their
    /// upkeep.
    #[cfg(test)]
    pub(crate) fn run_index_sizes(&self) -> (usize, usize) {
        (self.by_run.len(), self.scans.len())
    }
}

fn unindex(index: &mut HashMap<String, BTreeSet<u64>>, key: &str, arrival: u64) {
    if let Some(arrivals) = index.get_mut(key) {
        arrivals.remove(&arrival);
        if arrivals.is_empty() {
            index.remove(key);
        }
    }
}

/// What a provider compares a repeat with: the message as sent (sender, recipients, subject,
/// bodies, `Reply-To`), not the envelope of the attempt.
pub(crate) fn fingerprint(message: &Message) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    (
        &message.from,
        &message.to,
        &message.subject,
        &message.text,
        &message.html,
        &message.reply_to,
    )
        .hash(&mut hasher);
    hasher.finish()
}

impl ByArrival for Messages {
    type Entry = Message;

    fn by_arrival(&self) -> &BTreeMap<u64, Message> {
        &self.by_arrival
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn remove_arrival(&mut self, arrival: u64) {
        self.forget(arrival);
    }
}

/// A key seen in provider mode.
pub(crate) struct SeenKey {
    /// The id of the copy it delivered.
    pub(crate) id: String,
    /// [`fingerprint`] of that copy.
    pub(crate) fingerprint: u64,
    /// When it is forgotten: its sighting plus the window in force then (a later change of the
    /// window does not shorten what a provider already promised to remember).
    until: OffsetDateTime,
}

/// Provider mode's memory: the keys seen within the window, forgotten when it ends. Each key
/// is remembered by its digest ([`key_digest`]), not as sent: however long the keys, an entry
/// takes a fixed few dozen bytes.
#[derive(Default)]
pub(crate) struct SeenKeys {
    keys: HashMap<KeyDigest, SeenKey>,
    /// Keys in the order they were seen, with when each is forgotten, to forget the oldest
    /// first. (After the window shrank an entry may end before the ones ahead of it: `get` does
    /// not return a key whose time is up, whatever is still queued.)
    order: VecDeque<(OffsetDateTime, KeyDigest)>,
}

impl SeenKeys {
    /// Forgets the keys whose time is up at `now`, oldest first.
    pub(crate) fn expire(&mut self, now: OffsetDateTime) {
        while let Some((until, _)) = self.order.front() {
            if *until > now {
                break;
            }
            let (until, oldest) = self.order.pop_front().expect("a front entry");
            // A key seen again later has a newer entry: only its last sighting forgets it.
            if self
                .keys
                .get(&oldest)
                .is_some_and(|seen| seen.until == until)
            {
                self.keys.remove(&oldest);
            }
        }
    }

    /// The key, if remembered at `now`.
    pub(crate) fn get(&self, key: &str, now: OffsetDateTime) -> Option<&SeenKey> {
        self.keys
            .get(&key_digest(key))
            .filter(|seen| seen.until > now)
    }

    /// Remembers `key` as delivered by the copy `id`, until `until`.
    pub(crate) fn insert(
        &mut self,
        key: &str,
        id: String,
        fingerprint: u64,
        until: OffsetDateTime,
    ) {
        let key = key_digest(key);
        self.order.push_back((until, key));
        self.keys.insert(
            key,
            SeenKey {
                id,
                fingerprint,
                until,
            },
        );
    }

    /// How many keys are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Forgets every key.
    pub(crate) fn clear(&mut self) {
        self.keys.clear();
        self.order.clear();
    }
}

/// What the inbox accepted under one delivery key, as [`Inbox::delivery`](crate::Inbox::delivery)
/// answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The key asked about.
    pub key: String,
    /// Whether any message under this key was accepted.
    pub accepted: bool,
    /// How many copies were accepted under it (a repeat that provider mode deduplicated is no
    /// copy of its own).
    pub copies: u64,
    /// The id of the first copy.
    pub first_id: Option<String>,
    /// When the first copy was accepted.
    #[serde(with = "time::serde::rfc3339::option")]
    pub first_accepted_at: Option<OffsetDateTime>,
    /// A message under this key is being decided now (received, not yet accepted or refused:
    /// a delay fault holds it): `accepted: false` is no answer yet.
    pub deciding: bool,
    /// Keys first accepted at or before this moment may have been forgotten (the oldest beyond
    /// the inbox's bound, or all of them at a reset): for a message that may have been sent by
    /// then, `accepted: false` is no answer. `null`: nothing was ever forgotten.
    #[serde(with = "time::serde::rfc3339::option")]
    pub forgotten_through: Option<OffsetDateTime>,
}

/// A delivery key as [`Deliveries`] remembers it: its SHA-256, 32 bytes whatever the key's
/// length (a 9 MB `Message-ID` costs what a UUID does).
pub(crate) type KeyDigest = [u8; 32];

/// The digest [`Deliveries`] remembers `key` by.
pub(crate) fn key_digest(key: &str) -> KeyDigest {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes()).into()
}

/// The delivery keys of every accepted message, kept apart from the mailbox: deleting messages
/// or their retention never turns "accepted" into "not accepted", as a provider remembers what
/// it took. Bounded: beyond [`Deliveries::MAX_KEYS`] keys the oldest are forgotten. Each key is
/// remembered by its digest ([`key_digest`]), not as sent, so the memory is bounded in bytes too
/// (a few MiB), however long the keys.
pub(crate) struct Deliveries {
    keys: HashMap<KeyDigest, (u64, String, OffsetDateTime)>,
    /// Keys in the order they were first accepted, to forget the oldest first.
    order: VecDeque<KeyDigest>,
    /// How many keys are remembered at most.
    max: usize,
    /// See [`Delivery::forgotten_through`].
    forgotten_through: Option<OffsetDateTime>,
    /// Keys of the messages being decided now, with how many of them.
    deciding: HashMap<KeyDigest, u32>,
}

impl Default for Deliveries {
    fn default() -> Self {
        Self::with_max(Self::MAX_KEYS)
    }
}

impl Deliveries {
    /// How many keys are remembered at most, by default: ten times the default mailbox (a
    /// message leaves up to three: its idempotency key, its Message-ID and that ID's key), about
    /// 20 MiB at most (a digest twice, the first copy's id, the map's entry), whatever the keys'
    /// length.
    pub(crate) const MAX_KEYS: usize = 100_000;

    fn with_max(max: usize) -> Self {
        Self {
            keys: HashMap::new(),
            order: VecDeque::new(),
            max,
            forgotten_through: None,
            deciding: HashMap::new(),
        }
    }

    /// The keys `message` is known by, as digests ([`key_digest`]): its idempotency key, its
    /// `Message-ID` whole, and the part before `@` without the brackets (the delivery key of
    /// `<key@host>`).
    pub(crate) fn keys_of(message: &Message) -> Vec<KeyDigest> {
        let mut keys: Vec<&str> = Vec::new();
        if let Some(key) = message.idempotency_key.as_deref() {
            keys.push(key);
        }
        if let Some(id) = message.message_id.as_deref() {
            keys.push(id);
            let bare = id.trim().trim_start_matches('<').trim_end_matches('>');
            keys.push(bare.split('@').next().unwrap_or(bare));
        }
        keys.sort_unstable();
        keys.dedup();
        keys.retain(|k| !k.is_empty());
        keys.into_iter().map(key_digest).collect()
    }

    /// Notes that a message known by `keys` ([`Deliveries::keys_of`]) is being decided
    /// (`true`) or no longer is (`false`).
    pub(crate) fn deciding(&mut self, keys: &[KeyDigest], now: bool) {
        for key in keys {
            if now {
                *self.deciding.entry(*key).or_default() += 1;
            } else if let Some(n) = self.deciding.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    self.deciding.remove(key);
                }
            }
        }
    }

    /// Notes that `message` (its id and arrival set) was accepted: under its idempotency key
    /// and under its `Message-ID` (whole, and the part before `@` without the brackets: the
    /// delivery key of `<key@host>`).
    pub(crate) fn accepted(&mut self, message: &Message) {
        for key in Self::keys_of(message) {
            match self.keys.get_mut(&key) {
                Some((copies, _, _)) => *copies += 1,
                None => {
                    self.keys
                        .insert(key, (1, message.id.clone(), message.received_at));
                    self.order.push_back(key);
                }
            }
        }
        while self.order.len() > self.max {
            if let Some(oldest) = self.order.pop_front()
                && let Some((_, _, at)) = self.keys.remove(&oldest)
            {
                self.forgotten_through = self.forgotten_through.max(Some(at));
            }
        }
    }

    /// What was accepted under `key`.
    pub(crate) fn get(&self, key: &str) -> Delivery {
        let digest = key_digest(key);
        let deciding = self.deciding.contains_key(&digest);
        match self.keys.get(&digest) {
            Some((copies, first_id, at)) => Delivery {
                key: key.to_owned(),
                accepted: true,
                copies: *copies,
                first_id: Some(first_id.clone()),
                first_accepted_at: Some(*at),
                deciding,
                forgotten_through: self.forgotten_through,
            },
            None => Delivery {
                key: key.to_owned(),
                accepted: false,
                copies: 0,
                first_id: None,
                first_accepted_at: None,
                deciding,
                forgotten_through: self.forgotten_through,
            },
        }
    }

    /// Forgets every key (at `now`: a key accepted until then may have been sent).
    pub(crate) fn clear(&mut self, now: OffsetDateTime) {
        self.keys = HashMap::new();
        self.order = VecDeque::new();
        self.forgotten_through = Some(now);
    }
}

#[cfg(test)]
mod delivery_tests {
    use super::*;

    fn message(id: &str, key: Option<&str>, message_id: Option<&str>) -> Message {
        Message {
            id: id.to_owned(),
            intake: crate::Intake::Http,
            received_at: OffsetDateTime::UNIX_EPOCH,
            from: "a@x.io".into(),
            to: vec!["b@x.io".into()],
            subject: "s".into(),
            text: "t".into(),
            html: None,
            reply_to: None,
            message_id: message_id.map(str::to_owned),
            idempotency_key: key.map(str::to_owned),
            raw: String::new(),
        }
    }

    #[test]
    fn keys_are_remembered_by_idempotency_key_and_message_id_and_the_oldest_forgotten_first() {
        let mut deliveries = Deliveries::with_max(4);
        assert_eq!(deliveries.get("a").forgotten_through, None);
        deliveries.accepted(&message("1", Some("a"), Some("<b@oncely>")));
        let first_at = deliveries.get("a").first_accepted_at;
        for key in ["a", "<b@oncely>", "b"] {
            let found = deliveries.get(key);
            assert!(found.accepted && found.copies == 1, "{key}: {found:?}");
            assert_eq!(found.first_id.as_deref(), Some("1"));
        }
        deliveries.accepted(&message("2", Some("a"), None));
        assert_eq!(deliveries.get("a").copies, 2);
        assert_eq!(deliveries.get("a").first_id.as_deref(), Some("1"));
        // Two more keys: the bound of 4 forgets the oldest ("a").
        deliveries.accepted(&message("3", Some("c"), Some("d@x")));
        assert!(
            !deliveries.get("a").accepted,
            "the oldest is forgotten first"
        );
        assert!(deliveries.get("d").accepted && deliveries.get("c").accepted);
        assert!(!deliveries.get("").accepted, "no empty key");
        // A "no" for a key as old as the forgotten one is no answer: the watermark says so.
        assert_eq!(deliveries.get("a").forgotten_through, first_at);
        let reset_at = OffsetDateTime::now_utc();
        deliveries.clear(reset_at);
        assert!(!deliveries.get("c").accepted);
        assert_eq!(deliveries.get("c").forgotten_through, Some(reset_at));
    }

    #[test]
    fn a_message_being_decided_is_said_so_until_its_verdict() {
        let mut deliveries = Deliveries::with_max(10);
        let slow = message("1", Some("k"), Some("<k@oncely>"));
        let keys = Deliveries::keys_of(&slow);
        deliveries.deciding(&keys, true);
        deliveries.deciding(&keys, true);
        assert!(deliveries.get("k").deciding && !deliveries.get("k").accepted);
        deliveries.deciding(&keys, false);
        assert!(deliveries.get("k").deciding, "the other attempt still is");
        deliveries.deciding(&keys, false);
        deliveries.accepted(&slow);
        let found = deliveries.get("k");
        assert!(found.accepted && !found.deciding, "{found:?}");
    }
}
