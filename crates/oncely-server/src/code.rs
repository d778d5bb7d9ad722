//! One-time codes — the code store beside the token store ([`crate::token`]) — and the rules of
//! the return URLs they travel to.
//!
//! When a link whose request chose a return URL is used, a code is minted: 256 bits, HMAC-SHA256
//! of the server secret over a random code id, base64url; only SHA-256 of the code is stored,
//! bound to the tenant, the flow and the user, for [`LIFETIME`], usable once
//! (`POST /v1/exchange`). The handler answers the code's id and the return URL; a middleware
//! outside the idempotency layer derives the code again and answers the redirect — so the
//! stored response (replayed to a retry) holds only the id, useless without the server secret,
//! and the code is stored in clear nowhere.

use std::net::IpAddr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use oncely::ServerSecret;
use uuid::Uuid;

use crate::identity::Proof;
use crate::token::Flow;

/// The longest return URL a tenant may name (what browsers and servers take safely).
pub const MAX_RETURN_URL: usize = 2048;

/// How long a code can be exchanged.
pub const LIFETIME: std::time::Duration = std::time::Duration::from_secs(60);

/// A code in plaintext: only ever in memory and in the redirect. Never printed.
pub struct Code(String);

impl Code {
    /// The code of id `id`.
    pub fn derive(secret: &ServerSecret, id: Uuid) -> Self {
        let mac = secret.mac("oncely/code/v1", &[id.as_bytes()]);
        Self(URL_SAFE_NO_PAD.encode(mac))
    }

    /// The text to put in the redirect.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What is stored: SHA-256 of the code.
    pub fn hash(&self) -> Vec<u8> {
        crate::token::hash(&self.0)
    }
}

impl std::fmt::Debug for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Code([REDACTED])")
    }
}

/// The proof a link of `flow` gives, if its use can mint a code (an email change link proves a
/// new mailbox to an account already signed in: it takes no return URL).
pub fn proof(flow: Flow) -> Option<Proof> {
    match flow {
        Flow::Verification => Some(Proof::Verification),
        Flow::PasswordReset => Some(Proof::PasswordReset),
        Flow::MagicLink => Some(Proof::MagicLink),
        Flow::Invite => Some(Proof::Invite),
        Flow::EmailChange => None,
    }
}

/// `return_to` with `code` appended to its query (an existing query is kept).
pub fn redirect(return_to: &str, code: &Code) -> String {
    let separator = match return_to.find('?') {
        None => "?",
        Some(at) if at + 1 == return_to.len() || return_to.ends_with('&') => "",
        Some(_) => "&",
    };
    format!("{return_to}{separator}code={}", code.expose())
}

/// Why a return URL is refused (`oncely tenant set --return-url`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReturnUrlError {
    /// Not an absolute URL.
    #[error("{0:?} is not an absolute URL")]
    NotAbsolute(String),
    /// Neither `https` nor `http` on a loopback host.
    #[error("{0:?}: use https (http only for localhost, 127.0.0.0/8 or [::1])")]
    Scheme(String),
    /// No host.
    #[error("{0:?} names no host")]
    NoHost(String),
    /// `user:password@` before the host (`https://app.example.com@evil.com/` goes to evil.com).
    #[error("{0:?} has user information before its host")]
    UserInfo(String),
    /// A fragment (`#…`): the code would follow it, out of the query.
    #[error("{0:?} has a fragment (#…)")]
    Fragment(String),
    /// A percent-encoded control character (`%0a`, `%0d`, …).
    #[error("{0:?} has an encoded control character")]
    Control(String),
    /// Longer than [`MAX_RETURN_URL`] bytes.
    #[error("a return URL is at most {MAX_RETURN_URL} bytes; this one has {0}")]
    TooLong(usize),
    /// A `code` parameter of its own: the application could read it instead of ours (login CSRF).
    #[error(
        "{0:?} has a `code` query parameter of its own: the code oncely appends would be its second"
    )]
    CodeParameter(String),
    /// A host written with a trailing dot, or port 0.
    #[error("{0:?}: write the host without a trailing dot and a port other than 0")]
    HostForm(String),
    /// Not written as it is compared: the canonical form differs.
    #[error("{given:?} is not written canonically; write it as {canonical}")]
    NotCanonical {
        /// What was given.
        given: String,
        /// The URL's canonical serialization.
        canonical: String,
    },
}

/// Checks a return URL for a tenant's list: absolute; `https`, or `http` on a loopback host; a
/// host (no trailing dot, no port 0); no user information; no fragment; no encoded control
/// character; no `code` parameter of its own; at most [`MAX_RETURN_URL`] bytes; and written exactly
/// as the `url` crate serializes it — requests compare byte for byte, so what is stored is what
/// a browser would be sent to (no `..`, default port, upper case or stray encoding hides).
pub fn validate_return_url(text: &str) -> Result<(), ReturnUrlError> {
    if text.len() > MAX_RETURN_URL {
        return Err(ReturnUrlError::TooLong(text.len()));
    }
    let given = || text.to_owned();
    let url = url::Url::parse(text).map_err(|_| ReturnUrlError::NotAbsolute(given()))?;
    if !matches!(url.scheme(), "https" | "http") {
        return Err(ReturnUrlError::Scheme(given()));
    }
    let loopback = match url.host() {
        None => return Err(ReturnUrlError::NoHost(given())),
        Some(url::Host::Domain("")) => return Err(ReturnUrlError::NoHost(given())),
        Some(url::Host::Domain(name)) => name == "localhost",
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
    };
    if url.scheme() == "http" && !loopback {
        return Err(ReturnUrlError::Scheme(given()));
    }
    let trailing_dot = matches!(url.host(), Some(url::Host::Domain(name)) if name.ends_with('.'));
    if trailing_dot || url.port() == Some(0) {
        return Err(ReturnUrlError::HostForm(given()));
    }
    // Any case, and `;` as a separator too: some frameworks read query names so.
    let own_code = url.query().is_some_and(|q| q.contains(';'))
        || url
            .query_pairs()
            .any(|(name, _)| name.eq_ignore_ascii_case("code"));
    if own_code {
        return Err(ReturnUrlError::CodeParameter(given()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ReturnUrlError::UserInfo(given()));
    }
    if url.fragment().is_some() || text.contains('#') {
        return Err(ReturnUrlError::Fragment(given()));
    }
    if encoded_control(text) {
        return Err(ReturnUrlError::Control(given()));
    }
    if url.as_str() != text {
        return Err(ReturnUrlError::NotCanonical {
            given: given(),
            canonical: url.as_str().to_owned(),
        });
    }
    Ok(())
}

/// Whether `text` percent-encodes a control character (`%00`–`%1f`, `%7f`).
fn encoded_control(text: &str) -> bool {
    text.as_bytes().windows(3).any(|w| {
        w[0] == b'%'
            && ((matches!(w[1], b'0' | b'1') && w[2].is_ascii_hexdigit())
                || (w[1] == b'7' && matches!(w[2], b'f' | b'F')))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_256_bits_stable_per_id_and_never_printed() {
        let secret = ServerSecret::new(vec![9; 32]).unwrap();
        let id = Uuid::new_v4();
        let a = Code::derive(&secret, id);
        assert_eq!(a.expose(), Code::derive(&secret, id).expose());
        assert_eq!(a.expose().len(), 43);
        assert_ne!(a.expose(), Code::derive(&secret, Uuid::new_v4()).expose());
        // Not a token of any flow with the same id.
        for flow in [
            Flow::Verification,
            Flow::PasswordReset,
            Flow::MagicLink,
            Flow::Invite,
        ] {
            assert_ne!(
                a.expose(),
                crate::token::Token::derive(&secret, flow, id).expose()
            );
        }
        assert_eq!(format!("{a:?}"), "Code([REDACTED])");
    }

    #[test]
    fn the_code_joins_the_query() {
        let code = Code("c0de".into());
        assert_eq!(
            redirect("https://app.example.com/cb", &code),
            "https://app.example.com/cb?code=c0de"
        );
        assert_eq!(
            redirect("https://app.example.com/cb?next=%2Fhome", &code),
            "https://app.example.com/cb?next=%2Fhome&code=c0de"
        );
        assert_eq!(
            redirect("https://app.example.com/cb?", &code),
            "https://app.example.com/cb?code=c0de"
        );
    }

    #[test]
    fn return_urls_are_absolute_https_or_loopback_http_and_canonical() {
        for ok in [
            "https://app.example.com/auth/callback",
            "https://app.example.com/",
            "https://app.example.com:8443/cb?from=mail",
            "http://localhost:3000/cb",
            "http://127.0.0.1/cb",
            "http://127.8.0.1:9/cb",
            "http://[::1]:8080/cb",
        ] {
            assert_eq!(validate_return_url(ok), Ok(()), "{ok}");
        }
        let refused = |text: &str| validate_return_url(text).unwrap_err();
        assert!(matches!(
            refused("/auth/callback"),
            ReturnUrlError::NotAbsolute(_)
        ));
        assert!(matches!(
            refused("http://app.example.com/cb"),
            ReturnUrlError::Scheme(_)
        ));
        assert!(matches!(
            refused("http://localhost.evil.com/cb"),
            ReturnUrlError::Scheme(_)
        ));
        assert!(matches!(
            refused("javascript:alert(1)"),
            ReturnUrlError::Scheme(_)
        ));
        assert!(matches!(
            refused("ftp://app.example.com/"),
            ReturnUrlError::Scheme(_)
        ));
        assert!(matches!(
            refused("file:///etc/passwd"),
            ReturnUrlError::Scheme(_)
        ));
        assert!(matches!(
            refused("https://app.example.com@evil.com/cb"),
            ReturnUrlError::UserInfo(_)
        ));
        assert!(matches!(
            refused("https://app.example.com/cb#x"),
            ReturnUrlError::Fragment(_)
        ));
        assert!(matches!(
            refused("https://app.example.com/cb#"),
            ReturnUrlError::Fragment(_)
        ));
        assert!(matches!(
            refused("https://app.example.com/cb%0a"),
            ReturnUrlError::Control(_)
        ));
        // Review of issue 16: a query `code` of the URL's own came first in the redirect (an
        // application reading the first took the attacker's: login CSRF); a trailing-dot host,
        // port 0 and a 20 KB URL were accepted.
        for own_code in [
            "https://app.example.com/cb?code=attacker",
            "https://app.example.com/cb?next=%2F&code=",
            "https://app.example.com/cb?Code=x",
            "https://app.example.com/cb?x=1;code=2",
        ] {
            assert!(
                matches!(refused(own_code), ReturnUrlError::CodeParameter(_)),
                "{own_code}"
            );
        }
        assert_eq!(
            validate_return_url("https://app.example.com/cb?codes=1"),
            Ok(())
        );
        assert!(matches!(
            refused("https://app.example.com./cb"),
            ReturnUrlError::HostForm(_)
        ));
        assert!(matches!(
            refused("https://app.example.com:0/cb"),
            ReturnUrlError::HostForm(_)
        ));
        let long = format!("https://app.example.com/{}", "a".repeat(MAX_RETURN_URL));
        assert!(matches!(refused(&long), ReturnUrlError::TooLong(_)));
        assert!(matches!(
            refused("https://app.example.com/?x=%0D"),
            ReturnUrlError::Control(_)
        ));
        for (given, canonical) in [
            ("https://APP.example.com/cb", "https://app.example.com/cb"),
            (
                "https://app.example.com:443/cb",
                "https://app.example.com/cb",
            ),
            (
                "https://app.example.com/auth/../evil",
                "https://app.example.com/evil",
            ),
            (
                "https://app.example.com/auth/%2e%2e/evil",
                "https://app.example.com/evil",
            ),
            ("https://app.example.com", "https://app.example.com/"),
            (
                "https://app.example.com/c b",
                "https://app.example.com/c%20b",
            ),
            ("https://app.example.com/c\nb", "https://app.example.com/cb"),
        ] {
            assert_eq!(
                refused(given),
                ReturnUrlError::NotCanonical {
                    given: given.into(),
                    canonical: canonical.into()
                },
                "{given}"
            );
        }
    }
}
