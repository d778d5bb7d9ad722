//! The `Idempotency-Key` header: parsing and validation.
//!
//! The value is an RFC 8941 sf-string (`"…"`, with `\"` and `\\` escapes) or a bare value.
//! Either way the key itself is 1–255 visible ASCII characters (`!` to `~`). A bare value may not
//! contain `"`, `\` or `,`: a comma is how HTTP intermediaries join repeated header lines, so a
//! bare key with one could be two keys folded together.

use std::fmt;

use http::HeaderMap;

/// The header that carries the key.
pub const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// The longest key accepted, in characters (after unescaping an sf-string).
pub const MAX_KEY_LEN: usize = 255;

/// The characters of a bare key as a regular-expression class (ECMA-262 and Rust `regex`):
/// visible ASCII without `"`, `\` and `,`. API descriptions use it for the header's pattern;
/// the property tests check that every string it matches parses.
pub const BARE_KEY_CLASS: &str = r"[!#-+\--\[\]-~]";

/// A validated idempotency key: 1–255 visible ASCII characters.
///
/// Built only by [`IdempotencyKey::parse`] (one header value) or [`IdempotencyKey::from_headers`].
///
/// ```
/// use oncely::IdempotencyKey;
/// assert_eq!(IdempotencyKey::parse(r#""order-1\"a""#).unwrap().as_str(), r#"order-1"a"#);
/// assert_eq!(IdempotencyKey::parse("8e03978e-40d5-43e8").unwrap().as_str(), "8e03978e-40d5-43e8");
/// assert!(IdempotencyKey::parse("").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a request's idempotency key was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// No `Idempotency-Key` header.
    #[error("the Idempotency-Key header is missing")]
    Missing,
    /// More than one `Idempotency-Key` header.
    #[error("more than one Idempotency-Key header was sent")]
    Multiple,
    /// The key is empty (`""` or nothing).
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("the Idempotency-Key is longer than {MAX_KEY_LEN} characters")]
    TooLong,
    /// A character outside visible ASCII, or one a bare key may not contain.
    #[error(
        "the Idempotency-Key contains a character that is not allowed (visible ASCII only; a bare key may not contain '\"', '\\\\' or ',')"
    )]
    InvalidCharacter,
    /// A value that starts as an sf-string but is not a well-formed one.
    #[error("the Idempotency-Key is not a well-formed structured-field string")]
    MalformedString,
}

impl IdempotencyKey {
    /// Parses one header value.
    pub fn parse(value: impl AsRef<[u8]>) -> Result<Self, KeyError> {
        let raw = value.as_ref();
        let key = match raw.first() {
            None => return Err(KeyError::Empty),
            Some(b'"') => unescape_sf_string(raw)?,
            Some(_) => {
                if raw
                    .iter()
                    .any(|&b| !is_visible(b) || matches!(b, b'"' | b'\\' | b','))
                {
                    return Err(KeyError::InvalidCharacter);
                }
                raw.to_vec()
            }
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        if !key.iter().copied().all(is_visible) {
            return Err(KeyError::InvalidCharacter);
        }
        // Every byte is visible ASCII, so this is valid UTF-8.
        Ok(Self(
            String::from_utf8(key).map_err(|_| KeyError::InvalidCharacter)?,
        ))
    }

    /// Finds and parses the key of a request: exactly one `Idempotency-Key` header.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, KeyError> {
        let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
        let first = values.next().ok_or(KeyError::Missing)?;
        if values.next().is_some() {
            return Err(KeyError::Multiple);
        }
        Self::parse(first.as_bytes())
    }

    /// The key as the client meant it (an sf-string unescaped).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_visible(b: u8) -> bool {
    (0x21..=0x7e).contains(&b)
}

/// RFC 8941 §4.2.5: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE, nothing after it.
fn unescape_sf_string(raw: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw[1..].iter();
    loop {
        match bytes.next() {
            None => return Err(KeyError::MalformedString),
            Some(b'"') => break,
            Some(b'\\') => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(c),
                _ => return Err(KeyError::MalformedString),
            },
            Some(&c) if (0x20..=0x7e).contains(&c) => out.push(c),
            Some(_) => return Err(KeyError::InvalidCharacter),
        }
    }
    if bytes.next().is_some() {
        return Err(KeyError::MalformedString);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_sf_strings_and_bare_values() {
        assert_eq!(IdempotencyKey::parse("\"abc\"").unwrap().as_str(), "abc");
        assert_eq!(
            IdempotencyKey::parse("abc-123_:/").unwrap().as_str(),
            "abc-123_:/"
        );
        assert_eq!(IdempotencyKey::parse(r#""a\\b""#).unwrap().as_str(), r"a\b");
        assert_eq!(IdempotencyKey::parse("\"a,b\"").unwrap().as_str(), "a,b");
    }

    #[test]
    fn rejects_what_the_contract_rejects() {
        let too_long = "a".repeat(256);
        let rejected = [
            ("", KeyError::Empty),
            ("\"\"", KeyError::Empty),
            (too_long.as_str(), KeyError::TooLong),
            ("a b", KeyError::InvalidCharacter),
            ("\"a b\"", KeyError::InvalidCharacter),
            ("a,b", KeyError::InvalidCharacter),
            ("é", KeyError::InvalidCharacter),
            ("\"abc", KeyError::MalformedString),
            ("\"abc\";x=1", KeyError::MalformedString),
            (r#""a\nb""#, KeyError::MalformedString),
        ];
        for (raw, error) in rejected {
            assert_eq!(IdempotencyKey::parse(raw), Err(error), "{raw:?}");
        }
        assert!(IdempotencyKey::parse("a".repeat(255)).is_ok());
    }

    #[test]
    fn two_headers_are_rejected_and_none_is_missing() {
        let mut headers = HeaderMap::new();
        assert_eq!(
            IdempotencyKey::from_headers(&headers),
            Err(KeyError::Missing)
        );
        headers.append(IDEMPOTENCY_KEY, "a".parse().unwrap());
        assert!(IdempotencyKey::from_headers(&headers).is_ok());
        headers.append(IDEMPOTENCY_KEY, "a".parse().unwrap());
        assert_eq!(
            IdempotencyKey::from_headers(&headers),
            Err(KeyError::Multiple)
        );
    }
}
