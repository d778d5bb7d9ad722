//! Who the client is, for the per-client email cap and the password-hashing pool's shares
//! ([`CallerAddr`]): the peer address of the connection, or — only when that peer is a
//! configured trusted proxy — the address the proxy forwarded in `X-Forwarded-For` or
//! `Forwarded` (RFC 7239 `for=`).
//!
//! The forwarded chain is walked from the right (the hop nearest to us), skipping trusted
//! proxies; the right-most untrusted hop is the client. Hops left of it were written by the
//! client itself and are never believed. Without a trusted proxy the headers are ignored.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use ipnet::IpNet;

/// The proxies (CIDRs) whose forwarding headers are believed. Empty: none.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Arc<Vec<IpNet>>);

impl TrustedProxies {
    /// The given networks.
    pub fn new(nets: Vec<IpNet>) -> Self {
        Self(Arc::new(nets))
    }

    /// Whether `ip` is a trusted proxy (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// No proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Parses `10.0.0.0/8,192.168.1.7,::1` (a bare address is a single host); a bad entry is an
/// error naming it.
pub fn parse_trusted_proxies(s: &str) -> Result<Vec<IpNet>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(parse_trusted_proxy)
        .collect()
}

/// One entry of `ONCELY_TRUSTED_PROXIES`: a CIDR or a single address.
pub fn parse_trusted_proxy(entry: &str) -> Result<IpNet, String> {
    let entry = entry.trim();
    IpNet::from_str(entry)
        .or_else(|_| IpAddr::from_str(entry).map(IpNet::from))
        .map_err(|_| {
            format!("{entry:?} is not a CIDR (examples: 10.0.0.0/8, 192.168.1.7, ::1/128)")
        })
}

/// The client's address: the peer, or what trusted proxies forwarded. `None` when no peer is
/// known (the caller must then not pool the request with others).
pub fn client_ip(
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
) -> Option<IpAddr> {
    let peer = canonical(peer?);
    if !trusted.contains(peer) {
        return Some(peer);
    }
    // The peer is a trusted proxy: walk what it forwarded, from the right.
    let chain = forwarded_chain(headers);
    let mut client = peer;
    for hop in chain.iter().rev() {
        match hop {
            Some(ip) if trusted.contains(*ip) => client = *ip,
            Some(ip) => return Some(*ip),
            // A hop we cannot read (`unknown`, an obfuscated name, garbage): nothing left of it
            // can be trusted; the nearest known hop is the answer.
            None => return Some(client),
        }
    }
    Some(client)
}

/// The caller's address (an axum extractor): the connection's peer, or what a trusted proxy
/// forwarded ([`client_ip`]). `None` when the server runs without connect info: such a request
/// is not counted against any client (it is never pooled with others).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerAddr(pub Option<IpAddr>);

impl CallerAddr {
    /// The caller's key for per-client limits ([`cap_bucket`]): its email-cap counters and its
    /// share of the password-hashing pool.
    pub fn bucket(&self) -> Option<String> {
        self.0.map(cap_bucket)
    }
}

/// The header in which an application's backend names the address of the person it acts for.
pub const CLIENT_IP_HEADER: &str = "oncely-client-ip";

impl CallerAddr {
    /// The caller of a request that carries a tenant's API key: such a request comes from the
    /// application's backend, which all its users share, so the caller is the address the
    /// backend names in `Oncely-Client-IP` (trusted: the key proves the backend), or unknown —
    /// never the peer: counting the backend as one client would let one stranger use up every
    /// user's caps (email caps, login failures, the hashing pool's per-client share). An error
    /// (for a 400) if the header is not one IP address.
    pub fn named_by_backend(headers: &HeaderMap) -> Result<Self, &'static str> {
        let mut values = headers.get_all(CLIENT_IP_HEADER).iter();
        let bad = "Oncely-Client-IP must be one IP address";
        match (values.next(), values.next()) {
            (None, _) => Ok(Self(None)),
            (Some(value), None) => value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<IpAddr>().ok())
                .map(|ip| Self(Some(ip)))
                .ok_or(bad),
            (Some(_), Some(_)) => Err(bad),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for CallerAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let trusted = parts
            .extensions
            .get::<TrustedProxies>()
            .cloned()
            .unwrap_or_default();
        Ok(Self(client_ip(
            peer(&parts.extensions),
            &parts.headers,
            &trusted,
        )))
    }
}

/// The hops a proxy forwarded, left (farthest) to right (nearest): `X-Forwarded-For` if the
/// request has it, else the `for=` of `Forwarded`. `None` is a hop that is not an address.
pub fn forwarded_chain(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let xff: Vec<_> = headers.get_all("x-forwarded-for").iter().collect();
    if !xff.is_empty() {
        return xff
            .into_iter()
            // Bytes that are not UTF-8 spoil only their own element: a client must not be
            // able to turn the whole line — with the address its proxy appended — into one
            // unreadable hop (and so be counted as the proxy).
            .flat_map(|value| {
                String::from_utf8_lossy(value.as_bytes())
                    .split(',')
                    .map(node)
                    .collect::<Vec<_>>()
            })
            .collect();
    }
    headers
        .get_all("forwarded")
        .iter()
        .flat_map(|value| forwarded_for(&String::from_utf8_lossy(value.as_bytes())))
        .collect()
}

/// The `for=` of each element of one `Forwarded` value (RFC 7239); an element without one is
/// an unreadable hop.
fn forwarded_for(value: &str) -> Vec<Option<IpAddr>> {
    split_unquoted(value, ',')
        .into_iter()
        .map(|element| {
            split_unquoted(element, ';')
                .into_iter()
                .filter_map(|pair| pair.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
                .and_then(|(_, value)| {
                    let value = value.trim();
                    let value = value
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .unwrap_or(value);
                    node(value)
                })
        })
        .collect()
}

/// Splits at `sep` outside double quotes.
fn split_unquoted(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// One node: `192.0.2.1`, `192.0.2.1:4711`, `[2001:db8::1]`, `[2001:db8::1]:80`, `2001:db8::1`.
fn node(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        return ip.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    let (ip, port) = s.rsplit_once(':')?;
    if !is_port(port) {
        return None;
    }
    ip.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

fn is_port(s: &str) -> bool {
    !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit())
}

/// IPv4-mapped IPv6 (`::ffff:192.0.2.1`, as a dual-stack socket reports IPv4 peers) as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The rate-limit bucket of a client address: an IPv4 address as it is, an IPv6 address by its
/// /64 — one subscriber's allocation, so that rotating through the 2^64 addresses of one's own
/// prefix does not escape the per-client cap.
pub fn cap_bucket(ip: IpAddr) -> String {
    match canonical(ip) {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & (u128::MAX << 64);
            format!("{}/64", std::net::Ipv6Addr::from(prefix))
        }
        v4 => v4.to_string(),
    }
}

/// The peer of a connection served with connect info, if any.
fn peer(extensions: &axum::http::Extensions) -> Option<IpAddr> {
    extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// The client of a request from `peer` with `headers`.
    fn via(peer: &str, headers: &HeaderMap, trusted: &TrustedProxies) -> Option<IpAddr> {
        client_ip(Some(ip(peer)), headers, trusted)
    }

    #[test]
    fn bytes_that_are_not_utf8_spoil_only_their_own_hop() {
        let trusted = TrustedProxies::new(vec!["127.0.0.9/32".parse().unwrap()]);
        let mut map = HeaderMap::new();
        map.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"\xff, 203.0.113.5").unwrap(),
        );
        assert_eq!(
            via("127.0.0.9", &map, &trusted),
            Some(ip("203.0.113.5")),
            "the address the proxy appended is the client, not the proxy"
        );
        let mut map = HeaderMap::new();
        map.append(
            "forwarded",
            HeaderValue::from_bytes(b"for=\xff, for=203.0.113.6").unwrap(),
        );
        assert_eq!(via("127.0.0.9", &map, &trusted), Some(ip("203.0.113.6")));
    }

    #[test]
    fn ipv6_clients_share_a_cap_per_64_and_ipv4_per_address() {
        assert_eq!(
            cap_bucket(ip("2001:db8:1:2:aaaa::1")),
            cap_bucket(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"))
        );
        assert_eq!(cap_bucket(ip("2001:db8:1:2::1")), "2001:db8:1:2::/64");
        assert_ne!(
            cap_bucket(ip("2001:db8:1:2::1")),
            cap_bucket(ip("2001:db8:1:3::1"))
        );
        assert_eq!(cap_bucket(ip("192.0.2.1")), "192.0.2.1");
        assert_ne!(cap_bucket(ip("192.0.2.1")), cap_bucket(ip("192.0.2.2")));
        assert_eq!(cap_bucket(ip("::ffff:192.0.2.1")), "192.0.2.1");
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn trusted(s: &str) -> TrustedProxies {
        TrustedProxies::new(parse_trusted_proxies(s).unwrap())
    }

    #[test]
    fn without_trusted_proxies_the_headers_are_ignored() {
        let h = headers(&[
            ("x-forwarded-for", "203.0.113.9"),
            ("forwarded", "for=203.0.113.8"),
        ]);
        let none = TrustedProxies::default();
        assert_eq!(via("198.51.100.1", &h, &none), Some(ip("198.51.100.1")));
        // A peer that is not one of the trusted proxies is not believed either.
        assert_eq!(
            via("198.51.100.1", &h, &trusted("10.0.0.0/8")),
            Some(ip("198.51.100.1"))
        );
    }

    #[test]
    fn no_peer_is_no_client() {
        assert_eq!(
            client_ip(None, &HeaderMap::new(), &trusted("10.0.0.0/8")),
            None
        );
    }

    #[test]
    fn the_right_most_untrusted_hop_is_the_client() {
        let t = trusted("10.0.0.0/8, 192.168.0.1");
        // The client wrote 1.1.1.1 itself; 203.0.113.7 is what our first proxy saw.
        let h = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.7, 10.0.0.5")]);
        assert_eq!(via("192.168.0.1", &h, &t), Some(ip("203.0.113.7")));
        // Several headers are one list, in order.
        let h = headers(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "203.0.113.7:5555, 10.0.0.5"),
        ]);
        assert_eq!(via("10.1.1.1", &h, &t), Some(ip("203.0.113.7")));
        // Every hop trusted: the left-most is the client.
        let h = headers(&[("x-forwarded-for", "10.0.0.7, 10.0.0.5")]);
        assert_eq!(via("10.1.1.1", &h, &t), Some(ip("10.0.0.7")));
        // No header from a trusted peer: the peer.
        assert_eq!(
            client_ip(Some(ip("10.1.1.1")), &HeaderMap::new(), &t),
            Some(ip("10.1.1.1"))
        );
    }

    #[test]
    fn forwarded_for_with_ports_quotes_and_ipv6() {
        let t = trusted("::1/128,10.0.0.0/8");
        let h = headers(&[(
            "forwarded",
            r#"for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711", for="[::1]:80""#,
        )]);
        assert_eq!(
            forwarded_chain(&h),
            vec![
                Some(ip("192.0.2.60")),
                Some(ip("2001:db8:cafe::17")),
                Some(ip("::1"))
            ]
        );
        assert_eq!(via("10.0.0.2", &h, &t), Some(ip("2001:db8:cafe::17")));
        let h = headers(&[("forwarded", r#"for="192.0.2.43:47011""#)]);
        assert_eq!(via("::1", &h, &t), Some(ip("192.0.2.43")));
        // A quoted comma does not split elements.
        let h = headers(&[("forwarded", r#"proto=https;host="a,b";for=192.0.2.5"#)]);
        assert_eq!(forwarded_chain(&h), vec![Some(ip("192.0.2.5"))]);
    }

    #[test]
    fn garbage_stops_the_walk_at_the_nearest_known_hop() {
        let t = trusted("10.0.0.0/8");
        for garbage in [
            "not-an-ip",
            "unknown",
            "_hidden",
            "300.1.1.1",
            "[::1",
            "[::1]x",
            "1.2.3.4:port",
            "",
            "1.2.3.4, ",
        ] {
            let h = headers(&[("x-forwarded-for", garbage)]);
            let client = via("10.0.0.1", &h, &t);
            assert_eq!(client, Some(ip("10.0.0.1")), "{garbage:?}");
        }
        // Garbage left of the client does not matter.
        let h = headers(&[("x-forwarded-for", "garbage, 203.0.113.1, 10.0.0.3")]);
        assert_eq!(via("10.0.0.1", &h, &t), Some(ip("203.0.113.1")));
        // Forwarded without for=, or with an obfuscated node.
        for value in ["proto=https", "for=_secret", "for=unknown", "for", "=;=,"] {
            let h = headers(&[("forwarded", value)]);
            assert_eq!(via("10.0.0.1", &h, &t), Some(ip("10.0.0.1")), "{value}");
        }
    }

    #[test]
    fn ipv4_mapped_peers_are_ipv4() {
        let t = trusted("127.0.0.1/32");
        let h = headers(&[("x-forwarded-for", "::ffff:192.0.2.1")]);
        assert_eq!(via("::ffff:127.0.0.1", &h, &t), Some(ip("192.0.2.1")));
    }

    #[test]
    fn trusted_proxies_parse_cidrs_and_single_addresses_and_refuse_garbage() {
        let nets = parse_trusted_proxies("10.0.0.0/8, 127.0.0.1,::1/128").unwrap();
        assert_eq!(nets.len(), 3);
        assert!(parse_trusted_proxies("").unwrap().is_empty());
        let error = parse_trusted_proxies("10.0.0.0/8,10.0.0.0/33").unwrap_err();
        assert!(error.contains("\"10.0.0.0/33\" is not a CIDR"), "{error}");
        assert!(parse_trusted_proxies("proxy.internal").is_err());
    }
}
