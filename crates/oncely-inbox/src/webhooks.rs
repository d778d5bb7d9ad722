//! Webhooks the inbox receives (`POST /webhooks/{name}`): their Standard Webhooks signatures
//! checked, every copy kept with its verdict, bounded like the messages, indexed by id, by name
//! and by `webhook-id` per name (the duplicate key).
//!
//! Verification follows the reference `standardwebhooks` package: the headers `webhook-id`,
//! `webhook-timestamp` (Unix seconds, within [`TOLERANCE`] of the inbox's clock, either way)
//! and `webhook-signature` (space-separated `v1,<base64>`; other versions are skipped) are
//! required; a signature is HMAC-SHA256 over `<id>.<timestamp>.<body>` with the key = the
//! base64 after `whsec_`; any one matching signature of any known secret passes, compared in
//! constant time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use time::OffsetDateTime;

use crate::messages::{ByArrival, Received};

/// How far a `webhook-timestamp` may be from the inbox's clock, either way (the reference
/// libraries' tolerance): 5 minutes.
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// The prefix of a Standard Webhooks secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// Asks an application for the signing secrets (`whsec_…`) of an endpoint name the inbox has
/// none for ([`crate::Inbox::with_webhook_secrets_from`]). An empty list: none known (the copy
/// is accepted, marked unverified).
pub type SecretsResolver =
    Arc<dyn Fn(&str) -> Pin<Box<dyn Future<Output = Vec<String>> + Send + 'static>> + Send + Sync>;

/// A signing key: the bytes a `whsec_` secret stands for. Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Key(Vec<u8>);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

/// Why a secret cannot be used. Says nothing of the secret itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// After `whsec_`, not base64.
    #[error("a webhook secret is `whsec_` followed by base64, and this one is not base64")]
    NotBase64,
    /// No key at all.
    #[error("a webhook secret may not be empty")]
    Empty,
}

impl Key {
    /// Decodes a secret as the reference package does: `whsec_` (optional) then base64,
    /// padded or not.
    pub(crate) fn parse(secret: &str) -> Result<Self, SecretError> {
        let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret).trim();
        let unpadded = encoded.trim_end_matches('=');
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(unpadded)
            .map_err(|_| SecretError::NotBase64)?;
        if bytes.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self(bytes))
    }
}

/// What the signature check concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verification {
    /// A signature of a known secret matched, in time.
    Verified,
    /// The inbox knows no secret for the name: accepted without a check.
    Unverified,
    /// Refused (401): [`Webhook::problem`] says why.
    Invalid,
}

/// Why a signature check failed (the `problem` of the 401's body and of the kept copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Problem {
    /// `webhook-id`, `webhook-timestamp` or `webhook-signature` is missing (or empty).
    MissingHeaders,
    /// `webhook-timestamp` is not whole Unix seconds.
    InvalidTimestamp,
    /// `webhook-timestamp` is more than [`TOLERANCE`] behind the inbox's clock.
    TimestampTooOld,
    /// `webhook-timestamp` is more than [`TOLERANCE`] ahead of the inbox's clock.
    TimestampTooNew,
    /// No `v1` signature matches any known secret.
    NoMatchingSignature,
    /// The secrets known for the name (from the resolver) are none of them usable.
    UnusableSecret,
}

impl Problem {
    /// Its name: the `problem` of the 401's body and of the copy (as serialized).
    pub fn code(self) -> &'static str {
        match self {
            Self::MissingHeaders => "missing_headers",
            Self::InvalidTimestamp => "invalid_timestamp",
            Self::TimestampTooOld => "timestamp_too_old",
            Self::TimestampTooNew => "timestamp_too_new",
            Self::NoMatchingSignature => "no_matching_signature",
            Self::UnusableSecret => "unusable_secret",
        }
    }

    /// In words, for the 401's `detail`.
    pub fn detail(self) -> &'static str {
        match self {
            Self::MissingHeaders => {
                "webhook-id, webhook-timestamp and webhook-signature are all required"
            }
            Self::InvalidTimestamp => "webhook-timestamp is not a Unix time in whole seconds",
            Self::TimestampTooOld => "webhook-timestamp is more than 5 minutes old",
            Self::TimestampTooNew => "webhook-timestamp is more than 5 minutes in the future",
            Self::NoMatchingSignature => {
                "no v1 signature in webhook-signature matches a secret of this endpoint"
            }
            Self::UnusableSecret => "no secret known for this endpoint is usable",
        }
    }
}

/// The three Standard Webhooks headers as received (each `None` when absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    /// `webhook-id`.
    pub id: Option<String>,
    /// `webhook-timestamp`.
    pub timestamp: Option<String>,
    /// `webhook-signature`.
    pub signature: Option<String>,
}

/// Checks `headers` and `body` against `keys` at `now` (see the module's documentation).
pub(crate) fn verify(
    keys: &[Key],
    headers: &Headers,
    body: &[u8],
    now: OffsetDateTime,
) -> Result<(), Problem> {
    let present = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
    let (Some(id), Some(timestamp), Some(signatures)) = (
        present(&headers.id),
        present(&headers.timestamp),
        present(&headers.signature),
    ) else {
        return Err(Problem::MissingHeaders);
    };
    let seconds: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| Problem::InvalidTimestamp)?;
    let at = OffsetDateTime::from_unix_timestamp(seconds).map_err(|_| Problem::InvalidTimestamp)?;
    if at < now - TOLERANCE {
        return Err(Problem::TimestampTooOld);
    }
    if at > now + TOLERANCE {
        return Err(Problem::TimestampTooNew);
    }
    let signed = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body].concat();
    let candidates: Vec<Vec<u8>> = signatures
        .split(' ')
        .filter_map(|versioned| versioned.split_once(','))
        .filter(|(version, _)| *version == "v1")
        .filter_map(|(_, sig)| base64::engine::general_purpose::STANDARD.decode(sig).ok())
        .collect();
    for key in keys {
        for candidate in &candidates {
            let mut mac =
                Hmac::<Sha256>::new_from_slice(&key.0).expect("HMAC takes a key of any length");
            mac.update(&signed);
            // Constant time.
            if mac.verify_slice(candidate).is_ok() {
                return Ok(());
            }
        }
    }
    Err(Problem::NoMatchingSignature)
}

/// A received webhook: one copy, whatever its verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Webhook {
    /// The inbox's id for this copy.
    pub id: String,
    /// The endpoint name (`/webhooks/{name}`).
    pub name: String,
    /// When it came (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
    /// `webhook-id` as received.
    pub webhook_id: Option<String>,
    /// `webhook-timestamp` as received.
    pub timestamp: Option<String>,
    /// `webhook-signature` as received (signatures, not secrets).
    pub signature: Option<String>,
    /// The signature check's verdict.
    pub verdict: Verification,
    /// Why it is invalid, if it is.
    pub problem: Option<Problem>,
    /// `type` of the JSON body, if the body is a JSON object with a string `type`.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// The body as received (bytes that are not UTF-8 shown as U+FFFD).
    pub body: String,
}

impl Webhook {
    /// The duplicate key: name and `webhook-id`, for copies that were not refused as invalid.
    fn key(&self) -> Option<(String, String)> {
        match (&self.webhook_id, self.verdict) {
            (Some(id), Verification::Verified | Verification::Unverified) => {
                Some((self.name.clone(), id.clone()))
            }
            _ => None,
        }
    }
}

/// Webhook counters since start or the last full reset (in [`crate::Stats::webhooks`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebhookStats {
    /// Requests that reached the end of their body.
    pub attempts: u64,
    /// Copies kept when they came, whatever their verdict.
    pub received: u64,
    /// Copies kept now (what `GET /webhooks` lists).
    pub kept: u64,
    /// Accepted copies whose `webhook-id` (per name) no kept accepted copy had.
    pub distinct: u64,
    /// Accepted copies whose `webhook-id` (per name) a kept accepted copy already had.
    pub duplicates: u64,
    /// Copies refused (401) for a missing, stale or wrong signature.
    pub invalid: u64,
    /// Copies accepted without a check (no secret known).
    pub unverified: u64,
    /// Attempts rejected by an injected fault (not kept).
    pub rejected: u64,
    /// Accepted copies whose connection was closed without an answer.
    pub dropped: u64,
    /// Copies removed by the retention bound.
    pub evicted: u64,
}

/// The kept webhooks and their indexes.
#[derive(Default)]
pub(crate) struct Webhooks {
    next: u64,
    by_arrival: BTreeMap<u64, Webhook>,
    by_id: HashMap<String, u64>,
    by_name: HashMap<String, BTreeSet<u64>>,
    by_key: HashMap<(String, String), BTreeSet<u64>>,
    /// What the kept copies take ([`crate::messages::webhook_size`]).
    bytes: usize,
}

impl Webhooks {
    /// Keeps `webhook`; `true` if a kept copy already had its duplicate key.
    pub(crate) fn insert(&mut self, mut webhook: Webhook) -> bool {
        webhook.body.shrink_to_fit();
        self.bytes += crate::messages::webhook_size(&webhook);
        let arrival = self.next;
        self.next += 1;
        let mut duplicate = false;
        if let Some(key) = webhook.key() {
            let copies = self.by_key.entry(key).or_default();
            duplicate = !copies.is_empty();
            copies.insert(arrival);
        }
        self.by_name
            .entry(webhook.name.clone())
            .or_default()
            .insert(arrival);
        self.by_id.insert(webhook.id.clone(), arrival);
        self.by_arrival.insert(arrival, webhook);
        duplicate
    }

    pub(crate) fn get(&self, id: &str) -> Option<&Webhook> {
        self.by_id.get(id).and_then(|a| self.by_arrival.get(a))
    }

    /// The kept copies, newest first, of `name` if given, of type `event_type` if given.
    pub(crate) fn list(&self, name: Option<&str>, event_type: Option<&str>) -> Vec<Webhook> {
        let typed = |w: &&Webhook| event_type.is_none_or(|t| w.event_type.as_deref() == Some(t));
        match name {
            None => self
                .by_arrival
                .values()
                .rev()
                .filter(typed)
                .cloned()
                .collect(),
            Some(name) => self.by_name.get(name).map_or_else(Vec::new, |arrivals| {
                arrivals
                    .iter()
                    .rev()
                    .filter_map(|a| self.by_arrival.get(a))
                    .filter(typed)
                    .cloned()
                    .collect()
            }),
        }
    }

    /// The newest copies whose name, type or `webhook-id` contains `query` (lower case; empty:
    /// every copy), at most `limit`, each with its copies; and how many match.
    pub(crate) fn search(&self, query: &str, limit: usize) -> (Vec<(Webhook, usize)>, usize) {
        let matches = |w: &Webhook| {
            query.is_empty()
                || w.name.to_lowercase().contains(query)
                || [&w.event_type, &w.webhook_id].iter().any(|v| {
                    v.as_deref()
                        .is_some_and(|v| v.to_lowercase().contains(query))
                })
        };
        let mut shown = Vec::new();
        let mut matching = 0;
        for webhook in self.by_arrival.values().rev().filter(|w| matches(w)) {
            matching += 1;
            if shown.len() < limit {
                shown.push((webhook.clone(), self.copies(webhook)));
            }
        }
        (shown, matching)
    }

    /// How many kept accepted copies share `webhook`'s name and `webhook-id` (1 if none).
    pub(crate) fn copies(&self, webhook: &Webhook) -> usize {
        webhook
            .key()
            .and_then(|key| self.by_key.get(&key))
            .map_or(1, BTreeSet::len)
    }

    pub(crate) fn len(&self) -> usize {
        self.by_arrival.len()
    }

    /// Each `webhook-id` of endpoint `name` with how many kept accepted copies have it.
    pub(crate) fn ids(&self, name: &str) -> BTreeMap<String, usize> {
        self.by_key
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|((_, id), arrivals)| (id.clone(), arrivals.len()))
            .collect()
    }

    pub(crate) fn clear(&mut self) {
        *self = Self {
            next: self.next,
            ..Self::default()
        };
    }

    fn forget(&mut self, arrival: u64) {
        let Some(webhook) = self.by_arrival.remove(&arrival) else {
            return;
        };
        self.bytes -= crate::messages::webhook_size(&webhook);
        self.by_id.remove(&webhook.id);
        if let Some(arrivals) = self.by_name.get_mut(&webhook.name) {
            arrivals.remove(&arrival);
            if arrivals.is_empty() {
                self.by_name.remove(&webhook.name);
            }
        }
        if let Some(key) = webhook.key()
            && let Some(arrivals) = self.by_key.get_mut(&key)
        {
            arrivals.remove(&arrival);
            if arrivals.is_empty() {
                self.by_key.remove(&key);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn index_sizes(&self) -> (usize, usize, usize) {
        (self.by_name.len(), self.by_key.len(), self.by_id.len())
    }
}

impl Received for Webhook {
    fn received_at(&self) -> OffsetDateTime {
        self.received_at
    }
}

impl ByArrival for Webhooks {
    type Entry = Webhook;

    fn by_arrival(&self) -> &BTreeMap<u64, Webhook> {
        &self.by_arrival
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn remove_arrival(&mut self, arrival: u64) {
        self.forget(arrival);
    }
}

/// The `type` of a JSON object body, if any.
pub(crate) fn event_type(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value.get("type")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, id: &str, ts: i64, body: &[u8]) -> String {
        let key = Key::parse(secret).unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(&key.0).unwrap();
        mac.update(format!("{id}.{ts}.").as_bytes());
        mac.update(body);
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        format!("v1,{sig}")
    }

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn the_specifications_example_verifies() {
        // From the Standard Webhooks specification's test vectors.
        let now = OffsetDateTime::from_unix_timestamp(1_614_265_330).unwrap();
        let headers = Headers {
            id: Some("msg_p5jXN8AQM9LWM0D4loKWxJek".into()),
            timestamp: Some("1614265330".into()),
            signature: Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=".into()),
        };
        let body = br#"{"test": 2432232314}"#;
        let keys = [Key::parse(SECRET).unwrap()];
        assert_eq!(verify(&keys, &headers, body, now), Ok(()));
        assert_eq!(
            verify(&keys, &headers, br#"{"test": 2432232315}"#, now),
            Err(Problem::NoMatchingSignature)
        );
    }

    #[test]
    fn a_problem_s_code_is_its_serialized_name() {
        use Problem::*;
        // The codes on the wire, pinned: the 401's `problem` and the kept copy's.
        for (p, code) in [
            (MissingHeaders, "missing_headers"),
            (InvalidTimestamp, "invalid_timestamp"),
            (TimestampTooOld, "timestamp_too_old"),
            (TimestampTooNew, "timestamp_too_new"),
            (NoMatchingSignature, "no_matching_signature"),
            (UnusableSecret, "unusable_secret"),
        ] {
            assert_eq!(p.code(), code);
            assert_eq!(serde_json::to_value(p).unwrap(), p.code());
        }
    }

    #[test]
    fn the_tolerance_is_five_minutes_either_way_inclusive() {
        let now = OffsetDateTime::from_unix_timestamp(2_000_000_000).unwrap();
        let keys = [Key::parse(SECRET).unwrap()];
        let at = |ts: i64| {
            let headers = Headers {
                id: Some("m".into()),
                timestamp: Some(ts.to_string()),
                signature: Some(sign(SECRET, "m", ts, b"{}")),
            };
            verify(&keys, &headers, b"{}", now)
        };
        assert_eq!(at(2_000_000_000 - 300), Ok(()));
        assert_eq!(at(2_000_000_000 + 300), Ok(()));
        assert_eq!(at(2_000_000_000 - 301), Err(Problem::TimestampTooOld));
        assert_eq!(at(2_000_000_000 + 301), Err(Problem::TimestampTooNew));
    }

    #[test]
    fn a_secret_parses_padded_or_not_and_its_debug_shows_nothing() {
        assert_eq!(
            Key::parse(SECRET).unwrap(),
            Key::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()
        );
        assert_eq!(
            Key::parse("whsec_YWJj").unwrap(),
            Key::parse("whsec_YWJj==").unwrap()
        );
        assert_eq!(Key::parse("whsec_!!"), Err(SecretError::NotBase64));
        assert_eq!(Key::parse("whsec_"), Err(SecretError::Empty));
        assert_eq!(
            format!("{:?}", Key::parse(SECRET).unwrap()),
            "Key(<redacted>)"
        );
    }
}
