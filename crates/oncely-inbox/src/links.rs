//! What a CI script looks for in a message: its links and one-time codes
//! (`GET /messages/{id}/links`), and the link scanner that fetches every link of a message on
//! arrival, as a mail provider's security scanner does ([`crate::Faults::link_scanner`]).
//!
//! Links: every `href` attribute of the HTML part (entities `&amp;`, `&quot;`, `&#39;`, `&lt;`,
//! `&gt;` decoded) and every bare `http://` or `https://` URL of the text and HTML parts — up to
//! whitespace, a quote or `<`/`>`, without trailing `.,;:!?` (nor a `)` it does not open) —
//! `http(s)` only, de-duplicated, in the order they first appear (the text part first).
//!
//! The scanner opens only the links whose origin is one its operator named ([`Origin`],
//! [`crate::Config::scan_origins`]: `oncely inbox --scan-origin`, the dev inbox's own service):
//! whoever can put a link in a message must not make the inbox fetch another service of the
//! machine. Origins are compared as parsed — by the one parser that also gives the address the
//! scanner connects to — and a redirect is never followed.
//!
//! Codes: a run of 6 to 8 ASCII digits that stands alone in the text (the HTML part with its tags
//! removed, if there is no text part) once the links are taken out — not part of a longer
//! word or number — and the value of a `code` query parameter of a link; de-duplicated, in
//! order.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::Message;

/// The links and one-time codes found in a message ([`extract`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extracted {
    /// `http(s)` links, de-duplicated, in the order they first appear (text part first).
    pub links: Vec<String>,
    /// One-time codes: 6 to 8 digits standing alone, and `code` query parameters of links.
    pub codes: Vec<String>,
}

/// At most this many links and codes are extracted from one message (the first ones).
pub const MAX_EXTRACTED: usize = 1_000;

/// The links and codes of `message` (the rules: the [module docs](self)), at most
/// [`MAX_EXTRACTED`] of each; linear in the message's size.
pub fn extract(message: &Message) -> Extracted {
    let html = message.html.as_deref().unwrap_or("");
    let mut links = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut push = |link: String| {
        if links.len() < MAX_EXTRACTED && seen.insert(link.clone()) {
            links.push(link);
        }
    };
    bare_urls(&message.text).into_iter().for_each(&mut push);
    for link in hrefs(html).into_iter().chain(bare_urls(html)) {
        push(link);
    }
    let prose = if message.text.trim().is_empty() {
        strip_tags(html)
    } else {
        message.text.clone()
    };
    let mut codes = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for code in standalone_codes(&without_urls(&prose))
        .into_iter()
        .chain(links.iter().filter_map(|l| query_param(l, "code")))
    {
        if codes.len() < MAX_EXTRACTED && seen.insert(code.clone()) {
            codes.push(code);
        }
    }
    Extracted { links, codes }
}

/// Where a bare URL ends: whitespace, a quote, or an angle bracket.
fn ends_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`')
}

/// Every `http://` and `https://` URL in `text`, trailing punctuation left out.
fn bare_urls(text: &str) -> Vec<String> {
    let lower = text.to_ascii_lowercase();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find("http").map(|i| from + i) {
        from = at + 4;
        let rest = &lower[at..];
        if !(rest.starts_with("http://") || rest.starts_with("https://")) {
            continue;
        }
        // Not inside a word (`xhttp://`).
        if text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric())
        {
            continue;
        }
        let end = text[at..].find(ends_url).map_or(text.len(), |i| at + i);
        let mut url = &text[at..end];
        loop {
            let trimmed = url.trim_end_matches(['.', ',', ';', ':', '!', '?']);
            let trimmed = match trimmed.strip_suffix(')') {
                Some(inner) if !inner.contains('(') => inner,
                _ => trimmed,
            };
            if trimmed.len() == url.len() {
                break;
            }
            url = trimmed;
        }
        from = at + url.len().max(4);
        if url.len() > "https://".len() && url.contains("://") && !url.ends_with("://") {
            found.push(decode_entities(url));
        }
    }
    found
}

/// The `http(s)` values of every `href` attribute in `html`.
fn hrefs(html: &str) -> Vec<String> {
    let lower = html.to_ascii_lowercase();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find("href").map(|i| from + i) {
        from = at + 4;
        let after = lower[from..].trim_start();
        let Some(value) = after.strip_prefix('=') else {
            continue;
        };
        let value_at = lower.len() - value.trim_start().len();
        let (quote, start) = match html[value_at..].chars().next() {
            Some(q @ ('"' | '\'')) => (Some(q), value_at + 1),
            _ => (None, value_at),
        };
        let end = match quote {
            Some(q) => html[start..].find(q).map_or(html.len(), |i| start + i),
            None => html[start..]
                .find(|c: char| c.is_whitespace() || c == '>')
                .map_or(html.len(), |i| start + i),
        };
        let link = decode_entities(html[start..end].trim());
        let scheme = link.to_ascii_lowercase();
        if scheme.starts_with("http://") || scheme.starts_with("https://") {
            found.push(link);
        }
        from = end;
    }
    found
}

/// `text` with the entities an attribute or a text holds around a URL decoded.
fn decode_entities(text: &str) -> String {
    text.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&#x27;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// `html` as text: its tags (and the contents of `<style>` and `<head>`) removed.
fn strip_tags(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => {
                in_tag = true;
                out.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    decode_entities(&out)
}

/// `text` with its URLs blanked out (their digits are not codes), in one pass.
fn without_urls(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let (mut copied, mut from) = (0, 0);
    while let Some(at) = lower[from..].find("http").map(|i| from + i) {
        from = at + 4;
        let rest = &lower[at..];
        if !(rest.starts_with("http://") || rest.starts_with("https://")) {
            continue;
        }
        let end = text[at..].find(ends_url).map_or(text.len(), |i| at + i);
        out.push_str(&text[copied..at]);
        out.push(' ');
        (copied, from) = (end, end);
    }
    out.push_str(&text[copied..]);
    out
}

/// Runs of 6 to 8 ASCII digits with nothing joined to them: no letter or digit, no `_`, `-` or
/// `/`, no `.` or `,` that continues a number (`1234567.5`; a sentence's full stop is fine).
fn standalone_codes(text: &str) -> Vec<String> {
    let word = |c: char| c.is_alphanumeric() || "_-/".contains(c);
    let mut codes = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if !c.is_ascii_digit() {
            continue;
        }
        let mut end = start + 1;
        while let Some(&(i, d)) = chars.peek() {
            if !d.is_ascii_digit() {
                break;
            }
            end = i + 1;
            chars.next();
        }
        let mut before = text[..start].chars().rev();
        let mut after = text[end..].chars();
        let joined_before = match before.next() {
            Some('.' | ',') => before.next().is_some_and(|c| c.is_ascii_digit()),
            c => c.is_some_and(word),
        };
        let joined_after = match after.next() {
            Some('.' | ',') => after.next().is_some_and(|c| c.is_ascii_digit()),
            c => c.is_some_and(word),
        };
        if (6..=8).contains(&(end - start)) && !joined_before && !joined_after {
            codes.push(text[start..end].to_owned());
        }
    }
    codes
}

/// The value of the query parameter `name` of `link` (percent-encoding left as it is).
fn query_param(link: &str, name: &str) -> Option<String> {
    let query = link.split_once('?')?.1;
    let query = query.split('#').next().unwrap_or(query);
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, value)| *key == name && !value.is_empty())
        .map(|(_, value)| value.to_owned())
}

/// What the link scanner did with one link of a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scan {
    /// The link.
    pub url: String,
    /// The status its `GET` answered (redirects are not followed), if it was fetched.
    pub status: Option<u16>,
    /// Why it was not fetched, or why the fetch failed.
    pub error: Option<String>,
}

/// The most links of one message the scanner fetches (the rest are recorded as skipped).
pub(crate) const SCAN_MAX_LINKS: usize = 20;

/// How long one fetch may take, connection and answer's head together.
const SCAN_TIMEOUT: Duration = Duration::from_secs(5);

/// The most fetches at once, over every message.
static SCAN_PERMITS: Semaphore = Semaphore::const_new(4);

/// An origin the link scanner may open: `http://`, a loopback host — an IPv4 literal in
/// `127.0.0.0/8`, `[::1]`, `localhost` or a name under `.localhost` — and a port. Written as a
/// URL (`http://127.0.0.1:8080`, a trailing `/` allowed; no user, path, query or fragment).
/// Compared as parsed: the case of the scheme and host, the spelling of an IP literal and an
/// explicit default port (80) make no difference; anything else does (`localhost` is not
/// `127.0.0.1`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The host, in lower case; an IP literal as Rust writes it (an IPv6 one in brackets).
    host: String,
    port: u16,
}

impl Origin {
    /// Parses an origin (see [`Origin`]); the error says what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let target = target(text).map_err(|why| {
            format!(
                "{text:?} is not an origin the link scanner can open ({}): expected \
                 http://<loopback host>:<port>, e.g. http://127.0.0.1:8080",
                why.trim_start_matches("skipped: ")
            )
        })?;
        let after = &text.trim()[text.trim().find("://").map_or(0, |i| i + 3)..];
        let rest = after.find('/').map_or("", |i| &after[i..]);
        if !(rest.is_empty() || rest == "/") || after.contains(['?', '#']) {
            return Err(format!(
                "{text:?} is not an origin: an origin has no path, query or fragment (e.g. http://127.0.0.1:8080)"
            ));
        }
        Ok(target.origin)
    }

    /// The origin of `url` (a link, the service's public URL with its path), if the scanner
    /// could open it.
    pub fn of_url(url: &str) -> Result<Self, String> {
        target(url).map(|target| target.origin)
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            80 => write!(f, "http://{}", self.host),
            port => write!(f, "http://{}:{port}", self.host),
        }
    }
}

impl std::str::FromStr for Origin {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Self::parse(text)
    }
}

impl Serialize for Origin {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Origin {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Fetches every link of a message with `GET`, the way a provider's link scanner does, only
/// those whose origin is one of `origins` (all loopback, [`Origin`]): any other link is
/// recorded as skipped, never fetched, so that the inbox cannot reach another service, on the
/// machine or outside it; `https` is skipped too (no TLS client). The answer's status is
/// recorded; a redirect is not followed.
pub(crate) async fn scan(links: Vec<String>, origins: &[Origin]) -> Vec<Scan> {
    let mut scans = Vec::with_capacity(links.len());
    for (n, url) in links.into_iter().enumerate() {
        let outcome = if n >= SCAN_MAX_LINKS {
            Err(format!(
                "skipped: the scanner fetches the first {SCAN_MAX_LINKS} links of a message"
            ))
        } else {
            match target(&url) {
                Ok(target) if !origins.contains(&target.origin) => {
                    Err(not_allowed(&target.origin, origins))
                }
                Ok(Target {
                    addr, host, path, ..
                }) => {
                    let _permit = SCAN_PERMITS.acquire().await.ok();
                    match tokio::time::timeout(SCAN_TIMEOUT, get(addr, &host, &path)).await {
                        Ok(result) => result,
                        Err(_) => Err(format!("no answer within {}s", SCAN_TIMEOUT.as_secs())),
                    }
                }
                Err(why) => Err(why),
            }
        };
        let (status, error) = match outcome {
            Ok(status) => (Some(status), None),
            Err(error) => (None, Some(error)),
        };
        scans.push(Scan { url, status, error });
    }
    scans
}

/// Why a link to `origin` is not fetched.
fn not_allowed(origin: &Origin, origins: &[Origin]) -> String {
    if origins.is_empty() {
        return format!(
            "skipped: {origin} is not an origin the scanner opens: none is named (oncely inbox \
             --scan-origin URL; Config::scan_origins)"
        );
    }
    let named: Vec<String> = origins.iter().map(ToString::to_string).collect();
    format!(
        "skipped: {origin} is not an origin the scanner opens (it opens {})",
        named.join(", ")
    )
}

/// Where an `http://` link to a loopback host points.
pub(crate) struct Target {
    /// The address to connect to.
    pub(crate) addr: SocketAddr,
    /// The `Host` header: the link's authority as written.
    pub(crate) host: String,
    /// The path with its query.
    pub(crate) path: String,
    /// Its origin, normalized.
    pub(crate) origin: Origin,
}

/// Where an `http://` link to a loopback host points ([`Target`]); or why the scanner does not
/// fetch it. The one parser of links: what the origin check sees is what is fetched.
pub(crate) fn target(url: &str) -> Result<Target, String> {
    let url = url.trim();
    let Some(rest) = url
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .map(|_| &url[7..])
    else {
        return Err("skipped: the scanner fetches http:// links only".into());
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let path = path.split('#').next().unwrap_or("");
    let path = if path.is_empty() || path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    let not_loopback = || {
        format!(
            "skipped: {authority} is not a loopback host (the scanner never leaves the machine)"
        )
    };
    let unsafe_char = |c: char| c.is_control() || c == ' ';
    if authority.contains(['@', '\\'])
        || authority.chars().any(unsafe_char)
        || path.chars().any(unsafe_char)
    {
        return Err(not_loopback());
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => {
            let digits = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
            match port.parse::<u16>() {
                Ok(port) if digits && port > 0 => (host, port),
                _ => return Err(not_loopback()),
            }
        }
        _ => (authority, 80),
    };
    let lower = host.to_ascii_lowercase();
    let (ip, canonical) = if lower == "localhost" || lower.ends_with(".localhost") {
        let label =
            |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !lower.split('.').all(label) {
            return Err(not_loopback());
        }
        (IpAddr::V4(Ipv4Addr::LOCALHOST), lower)
    } else {
        let literal = match lower.strip_prefix('[') {
            Some(inner) => inner.strip_suffix(']').ok_or_else(not_loopback)?,
            None => lower.as_str(),
        };
        match (literal.parse::<IpAddr>(), lower.starts_with('[')) {
            (Ok(ip @ IpAddr::V4(_)), false) if ip.is_loopback() => (ip, ip.to_string()),
            (Ok(ip @ IpAddr::V6(_)), true) if ip.is_loopback() => (ip, format!("[{ip}]")),
            _ => return Err(not_loopback()),
        }
    };
    Ok(Target {
        addr: SocketAddr::new(ip, port),
        host: authority.to_owned(),
        path,
        origin: Origin {
            host: canonical,
            port,
        },
    })
}

/// One `GET` over HTTP/1.1: the status of the answer.
async fn get(addr: SocketAddr, host: &str, path: &str) -> Result<u16, String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: oncely-inbox link scanner\r\n\
         Accept: text/html,*/*\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 8192 {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| format!("cannot read the answer: {e}"))?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    line.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| line.starts_with("HTTP/"))
        .ok_or_else(|| "the answer is not HTTP".to_owned())
}

/// Runs the scanner on the links of `message` (kept as `id`) and records what it did in
/// `inbox`; the links are extracted in the task, outside the inbox's lock.
pub(crate) fn spawn_scan(inbox: crate::Inbox, id: String, message: Message, origins: Vec<Origin>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let links = tokio::task::spawn_blocking(move || extract(&message).links)
            .await
            .unwrap_or_default();
        let scans = scan(links, &origins).await;
        inbox.record_scans(&id, scans);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str, html: Option<&str>) -> Message {
        Message {
            id: "m".into(),
            intake: crate::Intake::Http,
            received_at: time::OffsetDateTime::UNIX_EPOCH,
            from: "a@x.io".into(),
            to: vec!["b@x.io".into()],
            subject: "s".into(),
            text: text.into(),
            html: html.map(str::to_owned),
            reply_to: None,
            message_id: None,
            idempotency_key: None,
            raw: String::new(),
        }
    }

    #[test]
    fn links_come_from_hrefs_and_bare_urls_in_order_without_duplicates_or_punctuation() {
        let found = extract(&message(
            "Open http://127.0.0.1:8080/v1/verify?token=abc_-9. Or (see https://x.io/help).\n\
             Not a link: mailto:a@x.io, ftp://x.io, xhttp://no.",
            Some(
                "<a HREF=\"http://127.0.0.1:8080/v1/verify?token=abc_-9\">verify</a> \
                 <a href='https://x.io/a?b=1&amp;c=2'>a</a> <a href=\"mailto:a@x.io\">m</a> \
                 <a href=#top>top</a> <p>https://x.io/plain</p>",
            ),
        ));
        assert_eq!(
            found.links,
            [
                "http://127.0.0.1:8080/v1/verify?token=abc_-9",
                "https://x.io/help",
                "https://x.io/a?b=1&c=2",
                "https://x.io/plain",
            ]
        );
    }

    #[test]
    fn codes_are_six_to_eight_digits_standing_alone_or_a_links_code_parameter() {
        let found = extract(&message(
            "Your code: 123456. Or 87654321, not 12345, not 123456789, not A123456, \
             not 2025-01-31, not 1234567.5; see http://h/x?id=99887766&code=ab-12",
            None,
        ));
        assert_eq!(found.codes, ["123456", "87654321", "ab-12"]);
        let html_only = extract(&message(
            "",
            Some("<p>Code <b>424242</b></p><img src=\"http://h/424243.png\">"),
        ));
        assert_eq!(html_only.codes, ["424242"]);
    }

    #[test]
    fn a_message_of_a_hundred_thousand_links_gives_the_first_thousand_once_each() {
        let text: String = (0..100_000)
            .map(|n| format!("http://a/{} 123456 ", n % 50_000))
            .collect();
        let found = extract(&message(&text, None));
        assert_eq!(found.links.len(), MAX_EXTRACTED);
        assert_eq!(found.links[0], "http://a/0");
        assert_eq!(found.links[999], "http://a/999");
        assert_eq!(found.codes, ["123456"]);
    }

    #[test]
    fn the_scanner_reaches_loopback_http_only() {
        let target = |url: &str| target(url).map(|t| (t.addr.to_string(), t.host, t.path));
        assert_eq!(
            target("http://127.0.0.1:8080/v1/verify?token=t#f"),
            Ok((
                "127.0.0.1:8080".into(),
                "127.0.0.1:8080".into(),
                "/v1/verify?token=t".into()
            ))
        );
        assert_eq!(
            target("HTTP://localhost?x=1"),
            Ok(("127.0.0.1:80".into(), "localhost".into(), "/?x=1".into()))
        );
        assert_eq!(target("http://[::1]:9/").unwrap().0, "[::1]:9");
        for refused in [
            "http://[127.0.0.1]/",
            "http://127.0.0.1:+80/",
            "http://127.0.0.1:0/",
            "http://127.0.0.1:/",
            "http://127.0.0.1:8080\\@127.0.0.1:9/",
            "http://a..localhost/",
            "https://127.0.0.1/",
            "http://example.com/",
            "http://10.0.0.1/",
            "http://127.0.0.1.nip.io/",
            "http://user@127.0.0.1/",
            "http://evil.test@127.0.0.1/",
            "http://127.0.0.1:x/",
            "http://2130706433/",
            // No header injection through the host.
            "http://a\r\nX-Injected: 1\r\n.localhost/",
            "http://a b.localhost/",
        ] {
            assert!(target(refused).is_err(), "{refused}");
        }
    }

    /// Issue 36, item 5: origins are compared as parsed, not as text.
    #[test]
    fn origins_are_compared_as_parsed() {
        let origin = |text: &str| Origin::parse(text).unwrap();
        for (same, as_) in [
            ("HTTP://LocalHost:80/", "http://localhost"),
            ("http://127.0.0.1:08080", "http://127.0.0.1:8080/"),
            ("http://[0:0::1]:8080", "http://[::1]:8080"),
            ("http://App.Localhost:3000", "http://app.localhost:3000"),
        ] {
            assert_eq!(origin(same), origin(as_), "{same} is {as_}");
        }
        assert_eq!(origin("HTTP://[0::1]:80/").to_string(), "http://[::1]");
        assert_eq!(
            origin("http://127.0.0.1:8080").to_string(),
            "http://127.0.0.1:8080"
        );
        for (other, than) in [
            ("http://localhost:8080", "http://127.0.0.1:8080"),
            ("http://127.0.0.1:8081", "http://127.0.0.1:8080"),
            ("http://127.0.0.2:8080", "http://127.0.0.1:8080"),
        ] {
            assert_ne!(origin(other), origin(than), "{other} is not {than}");
        }
        for refused in [
            "https://127.0.0.1:8080",
            "http://example.com",
            "http://127.0.0.1:8080/v1",
            "http://127.0.0.1:8080?x",
            "http://127.0.0.1:8080#x",
            "http://u@127.0.0.1:8080",
            "127.0.0.1:8080",
            "",
        ] {
            let error = Origin::parse(refused).unwrap_err();
            assert!(error.contains("origin"), "{refused}: {error}");
        }
        // A link's origin is what the scanner would connect to, whatever tricks it holds.
        let allowed = origin("http://127.0.0.1:8080");
        for link in [
            "http://127.0.0.1:8080.evil/",
            "http://127.0.0.1:80800/",
            "http://127.0.0.1:8080@127.0.0.1:21445/",
            "http://127.0.0.1:21445/http://127.0.0.1:8080/",
            "http://127.0.0.1:21445?http://127.0.0.1:8080",
            "http://127.0.0.1:21445#@127.0.0.1:8080",
            "http://localhost:8080/",
        ] {
            assert!(
                Origin::of_url(link).is_err() || Origin::of_url(link).unwrap() != allowed,
                "{link}"
            );
        }
        let json = serde_json::to_string(&allowed).unwrap();
        assert_eq!(json, "\"http://127.0.0.1:8080\"");
        assert_eq!(serde_json::from_str::<Origin>(&json).unwrap(), allowed);
        assert!(serde_json::from_str::<Origin>("\"http://10.0.0.1\"").is_err());
    }
}
