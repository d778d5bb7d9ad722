//! Request fingerprints and the keys derived for downstream calls.
//!
//! A fingerprint is HMAC-SHA256, keyed with the server secret, over the method, the route
//! template, the concrete path, the canonical query and the *canonical* body. It tells whether
//! a retry is the same request without storing or revealing the body (bodies can hold
//! passwords). Two requests for different resources (`/payments/1/refund`,
//! `/payments/2/refund`) never share a fingerprint, so a key reused across them is a 422, never
//! the other resource's answer.
//!
//! JSON bodies are canonicalised exactly: object keys sorted, whitespace dropped, numbers kept
//! as exact decimal values (`1`, `1.0`, `1e0` and `10e-1` are equal; `0.1` and
//! `0.10000000000000001` are not, nor are two integers past `u64`). There is no floating-point
//! round trip.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, KeyInit, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use serde_json::value::RawValue;
use sha2::Sha256;

use crate::Scope;

type HmacSha256 = Hmac<Sha256>;

/// The server secret: keys fingerprints and derived keys. Never printed.
///
/// Rotation: [`with_previous`](Self::with_previous) keeps earlier secrets for verification
/// during a grace period. New fingerprints and MACs use the current secret; a stored
/// fingerprint made with a previous one still counts as the same request (replayed, not 422),
/// and a key taken over from a row a previous secret fingerprinted keeps that secret's
/// [`DerivedKey`].
///
/// ```
/// use oncely::ServerSecret;
/// let secret = ServerSecret::new(b"a long random server secret".to_vec()).unwrap();
/// assert_eq!(format!("{secret:?}"), "ServerSecret([REDACTED])");
/// let old = ServerSecret::new(b"the secret before the rotation".to_vec()).unwrap();
/// let rotated = secret.with_previous(vec![old]);
/// assert_eq!(format!("{rotated:?}"), "ServerSecret([REDACTED], previous: 1)");
/// assert_eq!(rotated.all().count(), 2);
/// ```
#[derive(Clone)]
pub struct ServerSecret(Arc<SecretRing>);

struct SecretRing {
    current: SecretSlice<u8>,
    previous: Vec<ServerSecret>,
}

/// A secret too short to key an HMAC safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the server secret must be at least {MIN_SECRET_LEN} bytes")]
pub struct SecretTooShort;

/// The shortest secret accepted.
pub const MIN_SECRET_LEN: usize = 16;

impl ServerSecret {
    /// Wraps secret bytes; at least [`MIN_SECRET_LEN`] of them.
    pub fn new(bytes: Vec<u8>) -> Result<Self, SecretTooShort> {
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SecretTooShort);
        }
        Ok(Self(Arc::new(SecretRing {
            current: bytes.into(),
            previous: Vec::new(),
        })))
    }

    /// This secret, with `previous` secrets accepted for verification (newest first). Each
    /// previous secret contributes its current key only.
    pub fn with_previous(self, previous: Vec<ServerSecret>) -> Self {
        let previous = previous
            .into_iter()
            .map(|p| {
                Self(Arc::new(SecretRing {
                    current: p.0.current.expose_secret().to_vec().into(),
                    previous: Vec::new(),
                }))
            })
            .collect();
        Self(Arc::new(SecretRing {
            current: self.0.current.expose_secret().to_vec().into(),
            previous,
        }))
    }

    /// The previous secrets, newest first (each without previous secrets of its own).
    pub fn previous(&self) -> &[ServerSecret] {
        &self.0.previous
    }

    /// Every secret to try when verifying: this one (its [`mac`](Self::mac) is the current
    /// secret's), then the previous ones.
    pub fn all(&self) -> impl Iterator<Item = &ServerSecret> {
        std::iter::once(self).chain(self.0.previous.iter())
    }

    /// HMAC-SHA256 over length-prefixed parts, so that `("ab", "c")` and `("a", "bc")` differ.
    pub fn mac(&self, domain: &str, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = HmacSha256::new_from_slice(self.0.current.expose_secret())
            .expect("HMAC accepts keys of any length");
        for part in std::iter::once(domain.as_bytes()).chain(parts.iter().copied()) {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for ServerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.previous.len() {
            0 => f.write_str("ServerSecret([REDACTED])"),
            n => write!(f, "ServerSecret([REDACTED], previous: {n})"),
        }
    }
}

/// A rewrite applied to a JSON body before it is fingerprinted, so that requests that mean the
/// same thing match (for example: lower-casing an email address). It works on the exact
/// [`CanonicalJson`] tree (numbers kept as exact decimal text).
pub type JsonNormalizer = Arc<dyn Fn(&mut CanonicalJson) + Send + Sync>;

/// The fingerprint of a request: 32 bytes, comparable, revealing nothing about the body.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// What a fingerprint covers besides the body: the method, the route template, the concrete path
/// and the raw query string (canonicalised: see [`canonical_query`]).
#[derive(Debug, Clone, Copy)]
pub struct RequestTarget<'a> {
    /// The HTTP method, upper case.
    pub method: &'a str,
    /// The route template (`/payments/{id}/refund`).
    pub route: &'a str,
    /// The concrete path (`/payments/2/refund`).
    pub path: &'a str,
    /// The raw query string, without `?`, if any.
    pub query: Option<&'a str>,
}

impl<'a> RequestTarget<'a> {
    /// A target without a query whose path is its route (tests, non-templated routes).
    pub fn route(method: &'a str, route: &'a str) -> Self {
        Self {
            method,
            route,
            path: route,
            query: None,
        }
    }
}

/// The canonical request, computed once, then keyed with each secret that may have fingerprinted
/// a stored row (see [`ServerSecret::with_previous`]).
#[derive(Debug, Clone)]
pub struct CanonicalRequest {
    method: String,
    route: String,
    path: String,
    query: Vec<u8>,
    body: Vec<u8>,
    /// The parsed JSON body, kept to write it as fingerprint v1 saw it (numbers through
    /// `f64`/`u64`) — only when a stored row is not this release's (see [`Fingerprints`]).
    json: Option<CanonicalJson>,
}

impl CanonicalRequest {
    /// Canonicalises a request: the query by [`canonical_query`], a JSON body by
    /// [`canonical_body`] (other bodies byte for byte).
    pub fn new(
        target: &RequestTarget<'_>,
        content_type: Option<&str>,
        body: &[u8],
        normalize: Option<&JsonNormalizer>,
    ) -> Self {
        let json = parse_normalized(content_type, body, normalize);
        // Tagged, so that raw bytes never equal a canonical JSON text.
        let body = match &json {
            Some(value) => {
                let mut canonical = vec![b'j'];
                value.write_canonical(&mut canonical);
                canonical
            }
            None => [b"r", body].concat(),
        };
        Self {
            method: target.method.to_owned(),
            route: target.route.to_owned(),
            path: target.path.to_owned(),
            query: canonical_query(target.query.unwrap_or("")),
            body,
            json,
        }
    }

    /// The body as fingerprint v1 hashed it: canonical JSON with serde_json's numbers, or the
    /// raw bytes.
    fn legacy_body(&self) -> Vec<u8> {
        match &self.json {
            Some(value) => {
                let mut legacy = Vec::new();
                value.write_legacy_v1(&mut legacy);
                legacy
            }
            None => self.body[1..].to_vec(),
        }
    }

    /// The fingerprints a stored row of this request may carry: under every secret of `secret`
    /// ([`ServerSecret::all`], the current one first), then — for rows the previous release
    /// stored, until their retention ends — fingerprint v1 (method, route template, body with
    /// numbers through `f64`) under every secret, in the same order: entry `i` belongs to secret
    /// `i % secret.all().count()`. A row stored by this release carries a v2 fingerprint, which
    /// no v1 value equals (another HMAC domain): v1 only ever matches v1 rows. Remove v1 one
    /// retention period after every process runs this release.
    pub fn fingerprints(&self, secret: &ServerSecret) -> Vec<Fingerprint> {
        let legacy_body = self.legacy_body();
        let current = secret.all().map(|s| self.fingerprint(s));
        let legacy = secret.all().map(|s| {
            Fingerprint(s.mac(
                "oncely/fingerprint/v1",
                &[self.method.as_bytes(), self.route.as_bytes(), &legacy_body],
            ))
        });
        current.chain(legacy).collect()
    }

    /// The fingerprint of this request under `secret`'s current key.
    pub fn fingerprint(&self, secret: &ServerSecret) -> Fingerprint {
        Fingerprint(secret.mac(
            "oncely/fingerprint/v2",
            &[
                self.method.as_bytes(),
                self.route.as_bytes(),
                self.path.as_bytes(),
                &self.query,
                &self.body,
            ],
        ))
    }
}

/// The fingerprints a stored row of one request may carry ([`CanonicalRequest::fingerprints`]):
/// the current secret's v2 fingerprint is computed at once; the others — previous secrets, and
/// v1 for rows of the previous release — only the first time a stored row carries another one,
/// so a first request (the common case) costs one HMAC.
#[derive(Debug)]
pub struct Fingerprints {
    request: CanonicalRequest,
    secret: ServerSecret,
    current: Fingerprint,
    all: std::sync::OnceLock<Vec<Fingerprint>>,
}

impl Fingerprints {
    /// The candidates of `request` under `secret` and its previous secrets.
    pub fn new(request: CanonicalRequest, secret: &ServerSecret) -> Self {
        let current = request.fingerprint(secret);
        Self {
            request,
            secret: secret.clone(),
            current,
            all: std::sync::OnceLock::new(),
        }
    }

    /// The current secret's fingerprint: what a new claim stores.
    pub fn current(&self) -> &Fingerprint {
        &self.current
    }

    /// Which candidate `stored` is (0: the current one), if any.
    pub fn position(&self, stored: &Fingerprint) -> Option<usize> {
        if *stored == self.current {
            return Some(0);
        }
        self.all().iter().position(|f| f == stored)
    }

    /// Candidate `index`, as [`position`](Self::position) numbers them.
    pub fn get(&self, index: usize) -> &Fingerprint {
        match index {
            0 => &self.current,
            i => &self.all()[i],
        }
    }

    /// The secret that made candidate `index`.
    pub fn secret(&self, index: usize) -> &ServerSecret {
        let count = self.secret.all().count();
        self.secret
            .all()
            .nth(index % count)
            .expect("an index modulo the count is in range")
    }

    fn all(&self) -> &[Fingerprint] {
        self.all
            .get_or_init(|| self.request.fingerprints(&self.secret))
    }
}

impl Fingerprint {
    /// Fingerprints a request.
    ///
    /// A body whose content type is JSON (`application/json`, `…+json`) and that parses is
    /// canonicalised first: object keys sorted, whitespace dropped, numbers exact, `normalize`
    /// applied. Any other body is used byte for byte. The concrete path and the canonical query
    /// are covered too.
    ///
    /// ```
    /// use oncely::{Fingerprint, ServerSecret};
    /// use oncely::fingerprint::RequestTarget;
    /// let secret = ServerSecret::new(vec![7; 32]).unwrap();
    /// let target = RequestTarget::route("POST", "/payments");
    /// let a = Fingerprint::of_request(&secret, &target, Some("application/json"),
    ///     br#"{"amount": 10, "currency": "EUR"}"#, None);
    /// let b = Fingerprint::of_request(&secret, &target, Some("application/json"),
    ///     br#"{"currency":"EUR","amount":10.0}"#, None);
    /// assert_eq!(a, b);
    /// ```
    pub fn of_request(
        secret: &ServerSecret,
        target: &RequestTarget<'_>,
        content_type: Option<&str>,
        body: &[u8],
        normalize: Option<&JsonNormalizer>,
    ) -> Self {
        CanonicalRequest::new(target, content_type, body, normalize).fingerprint(secret)
    }

    /// Rebuilds a fingerprint read from storage.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", hex::encode(&self.0[..8]))
    }
}

/// A key for the calls a handler makes downstream (payment provider, email API): stable for
/// every retry of the same request scope, different for every other scope, and not the client's
/// key itself (which another tenant may also use).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DerivedKey(String);

impl DerivedKey {
    /// Derives the key of a scope.
    pub fn for_scope(secret: &ServerSecret, scope: &Scope) -> Self {
        let mac = secret.mac(
            "oncely/derived-key/v1",
            &[
                scope.tenant.as_str().as_bytes(),
                scope.method.as_bytes(),
                scope.route.as_bytes(),
                scope.key.as_str().as_bytes(),
            ],
        );
        Self(hex::encode(&mac[..20]))
    }

    /// The key: 40 lower-case hex characters.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for DerivedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DerivedKey({})", self.0)
    }
}

impl fmt::Display for DerivedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The canonical form of a JSON body, or `None` when the body is
/// not JSON, does not parse, or nests deeper than [`MAX_JSON_DEPTH`] (then the raw bytes are
/// fingerprinted).
pub fn canonical_body(
    content_type: Option<&str>,
    body: &[u8],
    normalize: Option<&JsonNormalizer>,
) -> Option<Vec<u8>> {
    let value = parse_normalized(content_type, body, normalize)?;
    let mut out = Vec::with_capacity(body.len());
    value.write_canonical(&mut out);
    Some(out)
}

/// A JSON body (by its content type) parsed and normalized; `None` for any other body.
fn parse_normalized(
    content_type: Option<&str>,
    body: &[u8],
    normalize: Option<&JsonNormalizer>,
) -> Option<CanonicalJson> {
    if !content_type.is_some_and(is_json) {
        return None;
    }
    let mut value = CanonicalJson::parse(body)?;
    if let Some(normalize) = normalize {
        normalize(&mut value);
    }
    Some(value)
}

fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The deepest nesting of arrays and objects canonicalised; deeper bodies are fingerprinted as
/// raw bytes (and never parsed further, however deep they go).
pub const MAX_JSON_DEPTH: usize = 128;

/// The longest exponent (in digits) a number may carry and still be compared by value; a longer
/// one is compared by its text (two spellings of such a number count as different requests,
/// never as the same one).
const MAX_EXPONENT_DIGITS: usize = 15;

/// A JSON value as fingerprinted: object keys sorted (by their bytes; a repeated key keeps its
/// last value, as serde_json does) and numbers kept exact ([`JsonNumber`]).
///
/// ```
/// use oncely::fingerprint::CanonicalJson;
/// let mut v = CanonicalJson::parse(br#"{"email": "A@X.IO", "n": 1.50}"#).unwrap();
/// if let Some(email) = v.get_mut("email").and_then(CanonicalJson::as_string_mut) {
///     *email = email.to_lowercase();
/// }
/// assert_eq!(v.get("email").and_then(CanonicalJson::as_str), Some("a@x.io"));
/// assert_eq!(v.to_canonical_string(), r#"{"email":"a@x.io","n":15e-1}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CanonicalJson {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// A number, exact.
    Number(JsonNumber),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<CanonicalJson>),
    /// An object, keys sorted.
    Object(BTreeMap<String, CanonicalJson>),
}

impl CanonicalJson {
    /// Parses JSON text; `None` if it is not JSON or nests deeper than [`MAX_JSON_DEPTH`].
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        // serde_json reads a RawValue without a depth limit: `from_raw` stops at MAX_JSON_DEPTH.
        let raw: &RawValue = serde_json::from_slice(bytes).ok()?;
        Self::from_raw(raw, 0)
    }

    fn from_raw(raw: &RawValue, depth: usize) -> Option<Self> {
        if depth > MAX_JSON_DEPTH {
            return None;
        }
        let text = raw.get();
        Some(match text.as_bytes().first()? {
            b'{' => {
                let entries: BTreeMap<String, &RawValue> = serde_json::from_str(text).ok()?;
                let mut map = BTreeMap::new();
                for (k, v) in entries {
                    map.insert(k, Self::from_raw(v, depth + 1)?);
                }
                Self::Object(map)
            }
            b'[' => {
                let items: Vec<&RawValue> = serde_json::from_str(text).ok()?;
                Self::Array(
                    items
                        .into_iter()
                        .map(|v| Self::from_raw(v, depth + 1))
                        .collect::<Option<_>>()?,
                )
            }
            b'"' => Self::String(serde_json::from_str(text).ok()?),
            b't' => Self::Bool(true),
            b'f' => Self::Bool(false),
            b'n' => Self::Null,
            _ => Self::Number(JsonNumber::parse(text)?),
        })
    }

    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&CanonicalJson> {
        match self {
            Self::Object(map) => map.get(key),
            _ => None,
        }
    }

    /// The member `key` of an object, to rewrite it.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut CanonicalJson> {
        match self {
            Self::Object(map) => map.get_mut(key),
            _ => None,
        }
    }

    /// The text of a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The text of a string, to rewrite it.
    pub fn as_string_mut(&mut self) -> Option<&mut String> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The canonical text: valid JSON, no whitespace, keys sorted, numbers canonical.
    pub fn to_canonical_string(&self) -> String {
        let mut out = Vec::new();
        self.write_canonical(&mut out);
        String::from_utf8(out).expect("canonical JSON is UTF-8")
    }

    fn write_canonical(&self, out: &mut Vec<u8>) {
        self.write_with(out, &|n, out| out.extend_from_slice(n.0.as_bytes()));
    }

    /// The body as fingerprint v1 wrote it: serde_json's numbers (`u64`, `i64`, else `f64`).
    fn write_legacy_v1(&self, out: &mut Vec<u8>) {
        self.write_with(out, &|n, out| {
            let value: serde_json::Value =
                serde_json::from_str(&n.0).unwrap_or(serde_json::Value::Null);
            serde_json::to_writer(&mut *out, &value).expect("writing to a Vec cannot fail");
        });
    }

    fn write_with(&self, out: &mut Vec<u8>, number: &dyn Fn(&JsonNumber, &mut Vec<u8>)) {
        match self {
            Self::Null => out.extend_from_slice(b"null"),
            Self::Bool(true) => out.extend_from_slice(b"true"),
            Self::Bool(false) => out.extend_from_slice(b"false"),
            Self::Number(n) => number(n, out),
            Self::String(s) => {
                serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail")
            }
            Self::Array(items) => {
                out.push(b'[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    v.write_with(out, number);
                }
                out.push(b']');
            }
            Self::Object(map) => {
                out.push(b'{');
                for (i, (k, v)) in map.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    serde_json::to_writer(&mut *out, k).expect("writing to a Vec cannot fail");
                    out.push(b':');
                    v.write_with(out, number);
                }
                out.push(b'}');
            }
        }
    }
}

/// A JSON number as an exact decimal, in one canonical spelling per value: `0` for zero (`-0`
/// too); an integer of at most 40 digits in plain digits (`-120`); anything else as integer
/// significand and exponent without trailing zeros (`15e-1`, `1e41`). The text is valid JSON,
/// except for a number whose exponent has more than 15 digits: that one is kept as the client
/// spelled it, behind a `#` (so it can only equal the very same spelling).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonNumber(String);

impl JsonNumber {
    /// Canonicalises the text of a JSON number; `None` if it is not one.
    pub fn parse(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        let (negative, rest) = match bytes.split_first()? {
            (b'-', rest) => (true, rest),
            _ => (false, bytes),
        };
        let int_len = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let (int, rest) = rest.split_at(int_len);
        if int.is_empty() || (int.len() > 1 && int[0] == b'0') {
            return None;
        }
        let (frac, rest) = match rest.split_first() {
            Some((b'.', after)) => {
                let n = after.iter().take_while(|b| b.is_ascii_digit()).count();
                if n == 0 {
                    return None;
                }
                after.split_at(n)
            }
            _ => (&rest[..0], rest),
        };
        let exp_text = match rest.split_first() {
            Some((b'e' | b'E', after)) => {
                let (sign, digits) = match after.split_first() {
                    Some((b'-', d)) => (-1i64, d),
                    Some((b'+', d)) => (1, d),
                    _ => (1, after),
                };
                if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                    return None;
                }
                Some((sign, digits))
            }
            None => None,
            _ => return None,
        };
        let mut digits: Vec<u8> = int.iter().chain(frac).copied().collect();
        let lead = digits.iter().take_while(|&&d| d == b'0').count();
        digits.drain(..lead);
        if digits.is_empty() {
            return Some(Self("0".to_owned()));
        }
        let trail = digits.iter().rev().take_while(|&&d| d == b'0').count();
        digits.truncate(digits.len() - trail);
        let exponent = match exp_text {
            None => 0i64,
            Some((sign, e)) => {
                let e = &e[e.iter().take_while(|&&d| d == b'0').count()..];
                if e.len() > MAX_EXPONENT_DIGITS {
                    // Too large to compare by value: keep the client's spelling (tagged so it
                    // never equals a canonical spelling).
                    return Some(Self(format!("#{text}")));
                }
                sign * std::str::from_utf8(e).ok()?.parse::<i64>().unwrap_or(0)
            }
        };
        // Both terms are far below i64::MAX (15-digit exponent, body-bounded lengths).
        let exponent = exponent - frac.len() as i64 + trail as i64;
        let sign = if negative { "-" } else { "" };
        let digits = String::from_utf8(digits).expect("ASCII digits");
        Some(Self(
            if (0..=40).contains(&(digits.len() as i64 + exponent)) && exponent >= 0 {
                format!("{sign}{digits}{}", "0".repeat(exponent as usize))
            } else if exponent == 0 {
                format!("{sign}{digits}")
            } else {
                format!("{sign}{digits}e{exponent}")
            },
        ))
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The canonical form of a query string: `&`-separated pairs, each split at its first `=`,
/// `+` read as a space and percent-decoded to bytes (as axum's `Query` reads them), then stably
/// sorted by name, so `a=1&b=2` equals `b=2&a=1` but `a=1&a=2` differs from `a=2&a=1`. Empty
/// pairs are dropped. Each name and value is length-prefixed in the result.
pub fn canonical_query(query: &str) -> Vec<u8> {
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (form_decode(name), form_decode(value))
        })
        .collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::with_capacity(query.len() + 16 * pairs.len());
    for (name, value) in pairs {
        for part in [name, value] {
            out.extend_from_slice(&(part.len() as u64).to_be_bytes());
            out.extend_from_slice(&part);
        }
    }
    out
}

fn form_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> ServerSecret {
        ServerSecret::new(vec![1; 32]).unwrap()
    }

    fn fp(method: &str, route: &str, ct: Option<&str>, body: &[u8]) -> Fingerprint {
        Fingerprint::of_request(
            &secret(),
            &RequestTarget::route(method, route),
            ct,
            body,
            None,
        )
    }

    fn at(path: &str, query: Option<&str>) -> Fingerprint {
        let target = RequestTarget {
            method: "POST",
            route: "/payments/{id}/refund",
            path,
            query,
        };
        Fingerprint::of_request(&secret(), &target, Some("application/json"), b"{}", None)
    }

    fn number(text: &str) -> String {
        JsonNumber::parse(text).unwrap().as_str().to_owned()
    }

    #[test]
    fn key_order_and_whitespace_do_not_matter_for_json() {
        let json = Some("application/json; charset=utf-8");
        assert_eq!(
            fp("POST", "/p", json, br#"{"a":1,"b":{"y":[1,2],"x":null}}"#),
            fp(
                "POST",
                "/p",
                json,
                b"{ \"b\" : {\"x\":null, \"y\":[1, 2]},\n\"a\":1 }"
            ),
        );
    }

    #[test]
    fn method_route_body_and_secret_all_matter() {
        let json = Some("application/json");
        let base = fp("POST", "/p", json, br#"{"a":1}"#);
        assert_ne!(base, fp("PUT", "/p", json, br#"{"a":1}"#));
        assert_ne!(base, fp("POST", "/q", json, br#"{"a":1}"#));
        assert_ne!(base, fp("POST", "/p", json, br#"{"a":2}"#));
        assert_ne!(base, fp("POST", "/p", json, br#"[{"a":1}]"#));
        let other = ServerSecret::new(vec![2; 32]).unwrap();
        assert_ne!(
            base,
            Fingerprint::of_request(
                &other,
                &RequestTarget::route("POST", "/p"),
                json,
                br#"{"a":1}"#,
                None
            )
        );
    }

    #[test]
    fn the_concrete_path_and_the_query_matter() {
        let one = at("/payments/1/refund", None);
        assert_ne!(one, at("/payments/2/refund", None));
        assert_ne!(one, at("/payments/1/refund", Some("full=true")));
        assert_eq!(at("/p", Some("a=1&b=2")), at("/p", Some("b=2&a=1")));
        assert_ne!(at("/p", Some("a=1&a=2")), at("/p", Some("a=2&a=1")));
        assert_eq!(at("/p", Some("a=1&b=2&a=3")), at("/p", Some("b=2&a=1&a=3")));
        assert_eq!(at("/p", Some("n=%41+b")), at("/p", Some("n=A%20b")));
        assert_ne!(at("/p", Some("n=a+b")), at("/p", Some("n=a%2Bb")));
        assert_eq!(at("/p", Some("")), at("/p", None));
        assert_ne!(at("/p", Some("a=1")), at("/p", Some("a1=")));
        assert_ne!(at("/p", Some("%FF=1")), at("/p", Some("%FE=1")));
    }

    #[test]
    fn numbers_are_canonical_and_exact() {
        for same in ["1", "1.0", "1e0", "10e-1", "0.1e1", "1.000E+0", "100e-2"] {
            assert_eq!(number(same), "1", "{same}");
        }
        for zero in ["0", "-0", "0.0", "-0.0e5", "0e-7"] {
            assert_eq!(number(zero), "0", "{zero}");
        }
        assert_eq!(number("-120"), "-120");
        assert_eq!(number("1.2e2"), "120");
        assert_eq!(number("1.50"), "15e-1");
        assert_ne!(number("0.1"), number("0.10000000000000001"));
        assert_ne!(
            number("18446744073709551616"),
            number("18446744073709551617")
        );
        assert_eq!(number("18446744073709551616"), "18446744073709551616");
        assert_ne!(number("1e400"), number("1e401"));
        assert_eq!(number("1e400"), number("10e399"));
        assert_eq!(number("1e400"), "1e400");
        // A huge exponent is compared by spelling, never expanded.
        let huge = format!("1e{}", "9".repeat(40));
        assert_eq!(number(&huge), format!("#{huge}"));
        assert_ne!(number(&huge), number(&format!("1e{}8", "9".repeat(39))));
        for bad in ["", "-", "01", "1.", ".5", "1e", "1e+", "+1", "1x", "--1"] {
            assert!(JsonNumber::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn json_numbers_in_bodies_are_never_rounded() {
        let body = |json: &[u8]| fp("POST", "/p", Some("application/json"), json);
        assert_ne!(
            body(br#"{"amount":0.1}"#),
            body(br#"{"amount":0.10000000000000001}"#)
        );
        assert_ne!(
            body(br#"[18446744073709551616]"#),
            body(br#"[18446744073709551617]"#)
        );
        assert_eq!(body(br#"{"amount":10}"#), body(br#"{"amount":1.0e1}"#));
        assert_eq!(body(br#"[0]"#), body(br#"[-0.0]"#));
    }

    #[test]
    fn deep_nesting_falls_back_to_raw_bytes() {
        let ct = Some("application/json");
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(canonical_body(ct, deep.as_bytes(), None), None);
        let ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert_eq!(
            canonical_body(ct, ok.as_bytes(), None).unwrap(),
            ok.as_bytes()
        );
        // Raw bytes and a canonical JSON text never collide.
        assert_ne!(
            fp("POST", "/p", Some("text/plain"), b"[]"),
            fp("POST", "/p", ct, b"[]")
        );
    }

    #[test]
    fn non_json_bodies_are_compared_byte_for_byte() {
        let text = Some("text/plain");
        assert_ne!(
            fp("POST", "/p", text, b"{\"a\":1}"),
            fp("POST", "/p", text, b"{ \"a\":1}")
        );
        assert_eq!(canonical_body(None, b"{}", None), None);
        assert_eq!(
            canonical_body(Some("application/json"), b"{not json", None),
            None
        );
        assert_eq!(
            canonical_body(Some("application/problem+json"), br#"{"b":1, "a":2}"#, None).unwrap(),
            br#"{"a":2,"b":1}"#
        );
    }

    #[test]
    fn the_normalizer_runs_before_hashing() {
        let lower: JsonNormalizer = Arc::new(|v: &mut CanonicalJson| {
            if let Some(s) = v.get_mut("email").and_then(CanonicalJson::as_string_mut) {
                *s = s.to_lowercase();
            }
        });
        let target = RequestTarget::route("POST", "/s");
        let normalized = |body: &[u8]| {
            let json = Some("application/json");
            Fingerprint::of_request(&secret(), &target, json, body, Some(&lower))
        };
        let a = normalized(br#"{"email":"A@X.IO"}"#);
        let b = normalized(br#"{"email":"a@x.io"}"#);
        assert_eq!(a, b);
    }

    #[test]
    fn previous_secrets_verify_and_never_print() {
        let old = ServerSecret::new(vec![3; 32]).unwrap();
        let rotated = secret().with_previous(vec![old.clone()]);
        let target = RequestTarget::route("POST", "/p");
        let canonical = CanonicalRequest::new(&target, None, b"x", None);
        let all = canonical.fingerprints(&rotated);
        assert_eq!(all[0], canonical.fingerprint(&secret()), "current first");
        assert_eq!(all[1], canonical.fingerprint(&old));
        assert_eq!(rotated.mac("d", &[b"x"]), secret().mac("d", &[b"x"]));
        assert_eq!(
            rotated.previous()[0].mac("d", &[b"x"]),
            old.mac("d", &[b"x"])
        );
        let printed = format!("{rotated:?} {:?}", rotated.previous());
        assert!(
            !printed.contains('\u{1}') && !printed.contains('\u{3}') && !printed.contains("[1, ")
        );
        assert_eq!(
            printed,
            "ServerSecret([REDACTED], previous: 1) [ServerSecret([REDACTED])]"
        );
    }

    #[test]
    fn a_short_secret_is_refused() {
        assert_eq!(ServerSecret::new(vec![0; 15]).unwrap_err(), SecretTooShort);
    }
}
