//! Which webhook URLs and addresses oncely calls: checked at `tenant webhook add` and again at
//! every delivery, where a DNS resolver drops refused addresses so that the address checked is
//! the address connected to (no DNS-rebinding window).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use url::{Host, Url};

/// The longest webhook URL accepted, in bytes.
pub const MAX_URL_BYTES: usize = 2048;

/// What a deployment lets webhooks reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UrlPolicy {
    /// `ONCELY_ENV=production`: https only, loopback refused too.
    pub production: bool,
    /// `ONCELY_WEBHOOK_ALLOW_PRIVATE`: every address is allowed (a private network's receiver).
    pub allow_private: bool,
}

/// Why a URL or an address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

impl UrlPolicy {
    /// Checks a URL's form and, when its host is an IP literal, its address: absolute
    /// http(s) (https only in production), no user info, no fragment, at most
    /// [`MAX_URL_BYTES`]. A host name is checked where it resolves ([`Self::allow_resolved`]).
    pub fn allow(&self, url: &str) -> Result<Url, Refused> {
        if url.len() > MAX_URL_BYTES {
            return Err(Refused(format!(
                "the URL is longer than {MAX_URL_BYTES} bytes"
            )));
        }
        let parsed =
            Url::parse(url).map_err(|e| Refused(format!("{url:?} is not an absolute URL: {e}")))?;
        match parsed.scheme() {
            "https" => {}
            "http" if !self.production => {}
            "http" => return Err(Refused("production webhooks must use https".into())),
            other => return Err(Refused(format!("{other}: only http(s) URLs"))),
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(Refused("the URL may not carry user info".into()));
        }
        if parsed.fragment().is_some() || url.contains('#') {
            return Err(Refused("the URL may not have a fragment".into()));
        }
        match parsed.host() {
            None => return Err(Refused("the URL names no host".into())),
            Some(Host::Ipv4(ip)) => self.allow_ip(IpAddr::V4(ip))?,
            Some(Host::Ipv6(ip)) => self.allow_ip(IpAddr::V6(ip))?,
            Some(Host::Domain(_)) => {}
        }
        Ok(parsed)
    }

    /// Checks `url` ([`Self::allow`]) and the addresses its host name resolves to now: every
    /// one must be allowed. A name that does not resolve (yet) passes: every delivery checks
    /// again where it connects.
    pub async fn allow_resolved(&self, url: &str) -> Result<Url, Refused> {
        let parsed = self.allow(url)?;
        if let Some(Host::Domain(name)) = parsed.host() {
            let port = parsed.port_or_known_default().unwrap_or(443);
            if let Ok(addrs) = tokio::net::lookup_host((name, port)).await {
                for addr in addrs {
                    self.allow_ip(addr.ip())
                        .map_err(|Refused(why)| Refused(format!("{name} resolves to {why}")))?;
                }
            }
        }
        Ok(parsed)
    }

    /// Whether oncely may connect to `ip`: see [`refused_range`]; development allows loopback,
    /// `ONCELY_WEBHOOK_ALLOW_PRIVATE` everything.
    pub fn allow_ip(&self, ip: IpAddr) -> Result<(), Refused> {
        if self.allow_private {
            return Ok(());
        }
        let ip = canonical(ip);
        if !self.production && ip.is_loopback() {
            return Ok(());
        }
        match refused_range(ip) {
            Some(range) => Err(Refused(format!(
                "{ip}, a {range} address (set ONCELY_WEBHOOK_ALLOW_PRIVATE=true to allow private networks)"
            ))),
            None => Ok(()),
        }
    }
}

/// An IPv4-mapped (`::ffff:a.b.c.d`) or IPv4-compatible (`::a.b.c.d`) IPv6 address as the IPv4
/// address it carries; any other address as it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            // IPv4-compatible (deprecated): ::a.b.c.d, but not :: and ::1 themselves.
            if s[..6].iter().all(|&x| x == 0)
                && v6 != Ipv6Addr::UNSPECIFIED
                && v6 != Ipv6Addr::LOCALHOST
            {
                return IpAddr::V4(Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7])));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

/// The refused range `ip` is in, by name; `None`: a public address. IPv4: every
/// special-purpose range of RFC 6890 and its updates (private, loopback, link-local, CGNAT,
/// benchmarking, documentation, protocol assignments, reserved, multicast, broadcast). IPv6:
/// only global unicast (2000::/3) is allowed, less its special-purpose blocks (protocol
/// assignments with Teredo, documentation, 6to4, which embeds an IPv4 address); everything
/// outside it — NAT64 (64:ff9b::/96, which reaches IPv4 through a gateway), IPv4-translated,
/// site-local, unique local, link-local, discard — is refused, and IPv4-mapped or -compatible
/// addresses are judged as the IPv4 address they carry.
pub fn refused_range(ip: IpAddr) -> Option<&'static str> {
    let v4 = |net: &str| IpNet::from(net.parse::<Ipv4Net>().expect("a valid network"));
    let v6 = |net: &str| IpNet::from(net.parse::<Ipv6Net>().expect("a valid network"));
    let ranges = [
        (v4("0.0.0.0/8"), "\"this network\" (0/8)"),
        (v4("10.0.0.0/8"), "private"),
        (v4("100.64.0.0/10"), "carrier-grade NAT"),
        (v4("127.0.0.0/8"), "loopback"),
        (v4("169.254.0.0/16"), "link-local"),
        (v4("172.16.0.0/12"), "private"),
        (v4("192.0.0.0/24"), "IETF protocol assignment"),
        (v4("192.0.2.0/24"), "documentation"),
        (v4("192.88.99.0/24"), "6to4 relay"),
        (v4("192.168.0.0/16"), "private"),
        (v4("198.18.0.0/15"), "benchmarking"),
        (v4("198.51.100.0/24"), "documentation"),
        (v4("203.0.113.0/24"), "documentation"),
        (v4("224.0.0.0/4"), "multicast"),
        (v4("240.0.0.0/4"), "reserved (or broadcast)"),
        (v6("::/128"), "unspecified"),
        (v6("::1/128"), "loopback"),
        (v6("64:ff9b::/96"), "NAT64"),
        (v6("64:ff9b:1::/48"), "NAT64 (local)"),
        (v6("::ffff:0:0:0/96"), "IPv4-translated"),
        (v6("100::/64"), "discard"),
        (v6("fc00::/7"), "private (unique local)"),
        (v6("fe80::/10"), "link-local"),
        (v6("fec0::/10"), "site-local"),
        (v6("ff00::/8"), "multicast"),
        (
            v6("2001::/23"),
            "IETF protocol assignment (Teredo included)",
        ),
        (v6("2001:db8::/32"), "documentation"),
        (v6("2002::/16"), "6to4"),
        (v6("3fff::/20"), "documentation"),
    ];
    let ip = canonical(ip);
    if let Some((_, name)) = ranges.iter().find(|(net, _)| net.contains(&ip)) {
        return Some(name);
    }
    match ip {
        IpAddr::V6(_) if !v6("2000::/3").contains(&ip) => Some("reserved (not global unicast)"),
        _ => None,
    }
}

/// The resolver of the webhook client: the system's, minus the addresses [`UrlPolicy`]
/// refuses. A name with no allowed address fails with [`RefusedAddress`] before any connection.
#[derive(Debug, Clone, Copy)]
pub struct CheckingResolver {
    /// What may be connected to.
    pub policy: UrlPolicy,
}

/// A host name that resolves only to refused addresses (found in a request error's sources).
#[derive(Debug, Clone, thiserror::Error)]
#[error("refused address: {0}")]
pub struct RefusedAddress(pub String);

impl reqwest::dns::Resolve for CheckingResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy;
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|addr| match policy.allow_ip(addr.ip()) {
                    Ok(()) => true,
                    Err(Refused(why)) => {
                        refused.get_or_insert(why);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let why = refused.unwrap_or_else(|| "no address".into());
                return Err(
                    Box::new(RefusedAddress(format!("{name} resolves to {why}")))
                        as Box<dyn std::error::Error + Send + Sync>,
                );
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The [`RefusedAddress`] among an error's sources, if any.
pub fn refused_address<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a RefusedAddress> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(refused) = e.downcast_ref::<RefusedAddress>() {
            return Some(refused);
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRODUCTION: UrlPolicy = UrlPolicy {
        production: true,
        allow_private: false,
    };
    const DEVELOPMENT: UrlPolicy = UrlPolicy {
        production: false,
        allow_private: false,
    };
    const PRODUCTION_PRIVATE: UrlPolicy = UrlPolicy {
        production: true,
        allow_private: true,
    };
    const DEVELOPMENT_PRIVATE: UrlPolicy = UrlPolicy {
        production: false,
        allow_private: true,
    };

    /// (url, production, development, production + allow, development + allow).
    const TABLE: &[(&str, bool, bool, bool, bool)] = &[
        ("https://hooks.example.com/oncely", true, true, true, true),
        ("http://hooks.example.com/oncely", false, true, false, true),
        ("https://93.184.216.34/x", true, true, true, true),
        ("https://127.0.0.1:8443/x", false, true, true, true),
        ("http://127.0.0.1:8080/x", false, true, false, true),
        ("https://[::1]/x", false, true, true, true),
        ("https://[::ffff:127.0.0.1]/x", false, true, true, true),
        ("https://[::ffff:10.0.0.1]/x", false, false, true, true),
        ("https://[::10.0.0.1]/x", false, false, true, true),
        ("https://10.0.0.1/x", false, false, true, true),
        ("https://172.16.5.4/x", false, false, true, true),
        ("https://192.168.1.1/x", false, false, true, true),
        ("https://169.254.169.254/latest", false, false, true, true),
        ("https://100.64.0.1/x", false, false, true, true),
        ("https://0.0.0.0/x", false, false, true, true),
        ("https://0.1.2.3/x", false, false, true, true),
        ("https://224.0.0.1/x", false, false, true, true),
        ("https://255.255.255.255/x", false, false, true, true),
        ("https://[::]/x", false, false, true, true),
        ("https://[fd00::1]/x", false, false, true, true),
        ("https://[fe80::1]/x", false, false, true, true),
        ("https://[ff02::1]/x", false, false, true, true),
        ("https://2130706433/x", false, true, true, true), // 127.0.0.1 as one number
        // Regression (review of issue 17): special-purpose ranges that were let through.
        ("https://[64:ff9b::7f00:1]/x", false, false, true, true), // NAT64 of 127.0.0.1
        ("https://[64:ff9b:1::a00:1]/x", false, false, true, true),
        ("https://[2002:7f00:1::]/x", false, false, true, true), // 6to4 of 127.0.0.1
        ("https://[::ffff:0:7f00:1]/x", false, false, true, true), // IPv4-translated
        ("https://[fec0::1]/x", false, false, true, true),       // site-local
        ("https://[2001::1]/x", false, false, true, true),       // Teredo
        ("https://[2001:db8::1]/x", false, false, true, true),
        ("https://[100::1]/x", false, false, true, true),
        ("https://198.18.0.1/x", false, false, true, true),
        ("https://198.19.255.1/x", false, false, true, true),
        ("https://240.0.0.1/x", false, false, true, true),
        ("https://192.0.0.1/x", false, false, true, true),
        ("https://192.0.2.1/x", false, false, true, true),
        ("https://203.0.113.9/x", false, false, true, true),
        ("https://[2606:4700::1111]/x", true, true, true, true), // a public IPv6 address
        (
            "https://user:pw@hooks.example.com/x",
            false,
            false,
            false,
            false,
        ),
        (
            "https://hooks.example.com/x#frag",
            false,
            false,
            false,
            false,
        ),
        ("ftp://hooks.example.com/x", false, false, false, false),
        ("/relative/path", false, false, false, false),
        ("https:///nohost", true, true, true, true), // the URL crate reads the host "nohost"
    ];

    #[test]
    fn the_url_rules_in_each_mode() {
        for &(url, production, development, production_private, development_private) in TABLE {
            for (policy, expected) in [
                (PRODUCTION, production),
                (DEVELOPMENT, development),
                (PRODUCTION_PRIVATE, production_private),
                (DEVELOPMENT_PRIVATE, development_private),
            ] {
                assert_eq!(
                    policy.allow(url).is_ok(),
                    expected,
                    "{url} under {policy:?}: {:?}",
                    policy.allow(url)
                );
            }
        }
        let long = format!("https://hooks.example.com/{}", "a".repeat(MAX_URL_BYTES));
        assert!(DEVELOPMENT_PRIVATE.allow(&long).is_err());
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_in_production_only() {
        assert!(
            PRODUCTION
                .allow_resolved("https://localhost/x")
                .await
                .is_err()
        );
        assert!(
            DEVELOPMENT
                .allow_resolved("http://localhost/x")
                .await
                .is_ok()
        );
        assert!(
            PRODUCTION_PRIVATE
                .allow_resolved("https://localhost/x")
                .await
                .is_ok()
        );
    }
}
