//! Request fingerprints and the keys derived for downstream calls.
//!
//! A fingerprint is HMAC-SHA256, keyed with the server secret, over the method, the route
//! template and the *canonical* body. It tells whether a retry is the same request without
//! storing or revealing the body (bodies can hold passwords).

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, KeyInit, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use serde_json::Value;
use sha2::Sha256;

use crate::Scope;

type HmacSha256 = Hmac<Sha256>;

/// The server secret: keys fingerprints and derived keys. Never printed.
///
/// ```
/// use oncely::ServerSecret;
/// let secret = ServerSecret::new(b"a long random server secret".to_vec()).unwrap();
/// assert_eq!(format!("{secret:?}"), "ServerSecret([REDACTED])");
/// ```
#[derive(Clone)]
pub struct ServerSecret(Arc<SecretSlice<u8>>);

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
        Ok(Self(Arc::new(bytes.into())))
    }

    /// HMAC-SHA256 over length-prefixed parts, so that `("ab", "c")` and `("a", "bc")` differ.
    pub fn mac(&self, domain: &str, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = HmacSha256::new_from_slice(self.0.expose_secret())
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
        f.write_str("ServerSecret([REDACTED])")
    }
}

/// A rewrite applied to a JSON body before it is fingerprinted, so that requests that mean the
/// same thing match (for example: lower-casing an email address).
pub type JsonNormalizer = Arc<dyn Fn(&mut Value) + Send + Sync>;

/// The fingerprint of a request: 32 bytes, comparable, revealing nothing about the body.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Fingerprints a request.
    ///
    /// A body whose content type is JSON (`application/json`, `…+json`) and that parses is
    /// canonicalised first: object keys sorted, whitespace dropped, `normalize` applied. Any other
    /// body is used byte for byte.
    ///
    /// ```
    /// use oncely::{Fingerprint, ServerSecret};
    /// let secret = ServerSecret::new(vec![7; 32]).unwrap();
    /// let a = Fingerprint::of_request(&secret, "POST", "/payments", Some("application/json"),
    ///     br#"{"amount": 10, "currency": "EUR"}"#, None);
    /// let b = Fingerprint::of_request(&secret, "POST", "/payments", Some("application/json"),
    ///     br#"{"currency":"EUR","amount":10}"#, None);
    /// assert_eq!(a, b);
    /// ```
    pub fn of_request(
        secret: &ServerSecret,
        method: &str,
        route: &str,
        content_type: Option<&str>,
        body: &[u8],
        normalize: Option<&JsonNormalizer>,
    ) -> Self {
        let canonical = canonical_body(content_type, body, normalize);
        let body = canonical.as_deref().unwrap_or(body);
        Self(secret.mac(
            "oncely/fingerprint/v1",
            &[method.as_bytes(), route.as_bytes(), body],
        ))
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

/// The canonical form of a JSON body, or `None` when the body is not JSON (then the raw bytes
/// are fingerprinted).
pub fn canonical_body(
    content_type: Option<&str>,
    body: &[u8],
    normalize: Option<&JsonNormalizer>,
) -> Option<Vec<u8>> {
    if !content_type.is_some_and(is_json) {
        return None;
    }
    let mut value: Value = serde_json::from_slice(body).ok()?;
    if let Some(normalize) = normalize {
        normalize(&mut value);
    }
    let mut out = Vec::with_capacity(body.len());
    write_canonical(&value, &mut out);
    Some(out)
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

/// Writes JSON with object keys sorted by their bytes, whatever map type serde_json was built
/// with (its `preserve_order` feature would otherwise keep the client's order).
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, k).expect("writing to a Vec cannot fail");
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar).expect("writing to a Vec cannot fail"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> ServerSecret {
        ServerSecret::new(vec![1; 32]).unwrap()
    }

    fn fp(method: &str, route: &str, ct: Option<&str>, body: &[u8]) -> Fingerprint {
        Fingerprint::of_request(&secret(), method, route, ct, body, None)
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
            Fingerprint::of_request(&other, "POST", "/p", json, br#"{"a":1}"#, None)
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
        let lower: JsonNormalizer = Arc::new(|v: &mut Value| {
            if let Some(Value::String(s)) = v.get_mut("email") {
                *s = s.to_lowercase();
            }
        });
        let ct = Some("application/json");
        let a = Fingerprint::of_request(
            &secret(),
            "POST",
            "/s",
            ct,
            br#"{"email":"A@X.IO"}"#,
            Some(&lower),
        );
        let b = Fingerprint::of_request(
            &secret(),
            "POST",
            "/s",
            ct,
            br#"{"email":"a@x.io"}"#,
            Some(&lower),
        );
        assert_eq!(a, b);
    }

    #[test]
    fn a_short_secret_is_refused() {
        assert_eq!(ServerSecret::new(vec![0; 15]).unwrap_err(), SecretTooShort);
    }
}
