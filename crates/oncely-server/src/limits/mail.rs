//! The email caps' counting: the caps ([`MailLimits`]), the per-client cap counted in this
//! process ([`ClientMail`]), and one email's counters and verdict ([`MailCount`]). The routes
//! that email count through it (`routes::mail_caps`); the per-address counters are rows the
//! account storage writes.
//!
//! The per-address counters are rows of `oncely_rate_limits` (one per address, or per address
//! and client: rows that concurrent requests for other addresses never share). The per-client
//! cap is counted in this process ([`ClientMail`]): a database row per client would be one row
//! that every request of a busy client (a NAT, an office, a load generator) updates, so those
//! requests would commit one after another.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use oncely::{ServerSecret, TenantId};
use time::OffsetDateTime;

use super::{HARD_CEILING, bucket};
use crate::client_addr::CallerAddr;
use crate::email::EmailAddress;

/// Caps on emails per window, per normalized address and per client.
#[derive(Debug, Clone, Copy)]
pub struct MailLimits {
    /// Emails per window to one address requested by one client (whether or not the address
    /// has an account). A client whose address is unknown counts only against the total.
    pub per_address: u32,
    /// Emails per window to one address from all clients together.
    pub per_address_total: u32,
    /// Emails per window requested by one client address.
    pub per_client: u32,
    /// The window.
    pub window: Duration,
}

/// The per-client email cap, counted in this process: a token bucket (GCRA) per tenant and
/// client bucket — `per_client` emails at once, then one more every `window / per_client`. In
/// any window-long span a client gets at most twice the cap, as a fixed window per database row
/// allowed, and the cap itself over a steady stream.
///
/// Bounded: at most [`ClientMail::MAX_CLIENTS`] clients are remembered, each forgotten after a
/// window without emails (its bucket is full again by then). Beyond that many clients in a
/// window, some are forgotten early (moka's TinyLFU chooses) and get a fresh allowance: a
/// sender needs that many client addresses to do it, and with that many addresses a per-client
/// cap is no obstacle anyway. The caps that protect a mailbox are the per-address ones, exact,
/// in the database.
///
/// Each `oncely serve` process counts its own clients: behind a load balancer that spreads one
/// client over `n` processes, the client gets up to `n` times the cap. An email counted here
/// whose request then fails (its handler answers an error: its transaction rolls back) is given
/// back ([`ClientCharge`]); one whose commit fails after its handler succeeded stays counted.
#[derive(Clone)]
pub struct ClientMail {
    /// Each client's theoretical arrival time (nanoseconds since `epoch`); `None`: a cap of 0.
    clients: Option<moka::sync::Cache<(String, String), Arc<AtomicU64>>>,
    /// Nanoseconds per email of a steady stream (`window / per_client`).
    interval: u64,
    /// How far ahead of now a client's arrival time may run: the window.
    tolerance: u64,
    epoch: std::time::Instant,
}

impl ClientMail {
    /// How many clients (per process) are remembered at most.
    pub const MAX_CLIENTS: u64 = 50_000;

    /// The cap of `limits` (`per_client` per `window`); a cap of 0 suppresses every email of a
    /// known client.
    pub fn new(limits: &MailLimits) -> Self {
        Self::with_capacity(limits, Self::MAX_CLIENTS)
    }

    fn with_capacity(limits: &MailLimits, max_clients: u64) -> Self {
        let window = limits.window.max(Duration::from_secs(1));
        let tolerance = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        let clients = (limits.per_client > 0).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(max_clients)
                .time_to_idle(window)
                .build()
        });
        Self {
            clients,
            interval: (tolerance / u64::from(limits.per_client.max(1))).max(1),
            tolerance,
            epoch: std::time::Instant::now(),
        }
    }

    /// Counts one email of `client` in `tenant`: `None` if it is over the cap (then it is not
    /// counted).
    fn charge(&self, tenant: &TenantId, client: &str) -> Option<ClientCharge> {
        let clients = self.clients.as_ref()?;
        let arrival = clients.get_with((tenant.as_str().to_owned(), client.to_owned()), || {
            Arc::new(AtomicU64::new(0))
        });
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let mut seen = arrival.load(Ordering::Acquire);
        loop {
            let next = seen.max(now).saturating_add(self.interval);
            if next - now > self.tolerance {
                return None;
            }
            match arrival.compare_exchange(seen, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return Some(ClientCharge(Some(Charged {
                        arrival,
                        interval: self.interval,
                        next,
                        epoch: self.epoch,
                    })));
                }
                Err(current) => seen = current,
            }
        }
    }

    /// [`ClientMail::charge`], kept.
    #[cfg(test)]
    fn allows(&self, tenant: &TenantId, client: &str) -> bool {
        self.charge(tenant, client)
            .map(ClientCharge::keep)
            .is_some()
    }

    /// How many clients it remembers (tests).
    #[doc(hidden)]
    pub fn clients(&self) -> u64 {
        self.clients.as_ref().map_or(0, |clients| {
            clients.run_pending_tasks();
            clients.entry_count()
        })
    }
}

/// One email counted against its client's cap in this process ([`ClientMail`]), given back when
/// dropped unless [`ClientCharge::keep`] was called: a handler keeps it once it has written
/// everything (then its transaction commits). A request that fails after counting — a lock not
/// free in time, the database gone: 503, "retry with the same key" — rolls back and stores no
/// email, so the retries a client is told to make must not use up its own emails.
#[must_use = "dropped, the email is given back: keep it once the request has succeeded"]
#[derive(Debug)]
pub struct ClientCharge(Option<Charged>);

/// What a [`ClientCharge`] counted: the client's arrival time, moved by `interval` to `next`.
#[derive(Debug)]
struct Charged {
    arrival: Arc<AtomicU64>,
    interval: u64,
    next: u64,
    epoch: std::time::Instant,
}

impl ClientCharge {
    /// Nothing counted (an unknown client, or one over its cap).
    pub fn nothing() -> Self {
        Self(None)
    }

    /// The request succeeded: the email stays counted.
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for ClientCharge {
    fn drop(&mut self) {
        if let Some(charged) = self.0.take() {
            // Give back only what of this email the client's arrival time still holds: the part
            // of its interval not yet elapsed. Once its interval has passed, the bucket refilled
            // it anyway, and later emails counted from "now" — moving their time back would give
            // the client an email it never had (second review).
            let now = u64::try_from(charged.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let back = charged.next.saturating_sub(now).min(charged.interval);
            if back > 0 {
                let _ = charged
                    .arrival
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |seen| {
                        Some(seen.saturating_sub(back))
                    });
            }
        }
    }
}

impl std::fmt::Debug for ClientMail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientMail")
            .field("interval_ns", &self.interval)
            .field("clients", &self.clients())
            .finish_non_exhaustive()
    }
}

/// One email to count against the caps: the per-client cap already counted (in this process),
/// the per-address counters to count in the request's transaction — by the account storage, alone
/// or in a statement that writes them along with others (a signup's) — and then
/// [`MailCount::verdict`] on their counts.
#[derive(Debug)]
pub struct MailCount {
    /// The counter of this address from this client; `None`: the client is unknown (only the
    /// address's total counts).
    pub pair: Option<String>,
    /// The counter of this address from all clients.
    pub address: String,
    /// The start of the window (Unix seconds).
    pub window_start: i64,
    /// The per-address cap (per client).
    pub per_address: i64,
    /// Whether the client's own cap let this email through (`true` for an unknown client).
    pub client_allowed: bool,
    /// The email as the client's cap counted it: [`ClientCharge::keep`] it once the request
    /// has succeeded.
    pub charge: ClientCharge,
}

impl MailCount {
    /// Counts the email against the client's cap (in this process) and names the counters.
    pub fn new(
        (limits, client_mail): (&MailLimits, &ClientMail),
        secret: &ServerSecret,
        tenant: &TenantId,
        email: &EmailAddress,
        caller: &CallerAddr,
    ) -> Self {
        let window = limits.window.as_secs().max(1) as i64;
        let window_start = OffsetDateTime::now_utc().unix_timestamp() / window * window;
        let bucket = |kind: &str, value: &str| bucket(secret, kind, value);
        // The email to the address from this client, and — only if the client's own caps let
        // it through — to the address from all clients: a client hammering one address past
        // its share cannot use up everyone else's.
        let (pair, charge) = match caller.bucket() {
            Some(client) => (
                Some(bucket(
                    "address-client",
                    &format!("{}\n{client}", email.as_str()),
                )),
                client_mail.charge(tenant, &client),
            ),
            None => (None, Some(ClientCharge::nothing())),
        };
        Self {
            pair,
            address: bucket("address", email.as_str()),
            window_start,
            per_address: i64::from(limits.per_address),
            client_allowed: charge.is_some(),
            charge: charge.unwrap_or_else(ClientCharge::nothing),
        }
    }

    /// Whether the email must be suppressed, and why, from the counts: this address from this
    /// client (0 for an unknown client), and this address from all clients (`None`: not
    /// counted, the client's caps stopped it first).
    pub fn verdict(
        &self,
        limits: &MailLimits,
        (to_address_from_client, to_address): (i64, Option<i64>),
    ) -> anyhow::Result<Option<String>> {
        let over = |limit, cap: u32, whom| {
            let reason = format!(
                "suppressed: over {cap} emails per {:?} {whom}",
                limits.window
            );
            Some((limit, reason))
        };
        let reason = if to_address_from_client > self.per_address {
            over("address", limits.per_address, "to this address")
        } else if !self.client_allowed {
            over("client", limits.per_client, "from this client")
        } else {
            // A client's first email to the address in the window always passes the total:
            // however many clients fill it, the owner (a client that has asked for nothing yet)
            // still gets its link — a mail bomb gains one email per client address it controls,
            // and no more than the hard ceiling in all.
            let to_address =
                to_address.context("the address is counted when the client's are not over")?;
            let first_from_client = to_address_from_client == 1;
            // But not past the hard ceiling: clients are cheap (an IPv6 prefix holds thousands,
            // a backend may name any address), so their first emails together stop there.
            let total = i64::from(limits.per_address_total);
            match to_address > total * HARD_CEILING || (to_address > total && !first_from_client) {
                true => over(
                    "address_total",
                    limits.per_address_total,
                    "to this address from all clients",
                ),
                false => None,
            }
        };
        Ok(reason.map(|(limit, reason)| {
            metrics::counter!("oncely_emails_suppressed_total", "limit" => limit).increment(1);
            reason
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_client: u32, window: Duration) -> MailLimits {
        MailLimits {
            per_address: 5,
            per_address_total: 20,
            per_client,
            window,
        }
    }

    #[test]
    fn a_client_gets_its_cap_then_nothing_and_other_clients_and_tenants_are_apart() {
        let caps = ClientMail::new(&limits(3, Duration::from_secs(3600)));
        let (acme, other) = (TenantId::parse("acme").unwrap(), TenantId::default());
        for _ in 0..3 {
            assert!(caps.allows(&acme, "a"));
        }
        assert!(!caps.allows(&acme, "a"), "the fourth email of the hour");
        assert!(caps.allows(&acme, "b"), "another client");
        assert!(
            caps.allows(&other, "a"),
            "the same client in another tenant"
        );
        assert_eq!(caps.clients(), 3);
    }

    #[test]
    fn an_email_whose_request_failed_is_given_back_and_a_kept_one_is_not() {
        let caps = ClientMail::new(&limits(1, Duration::from_secs(3600)));
        let tenant = TenantId::default();
        let failed = caps.charge(&tenant, "a").expect("the first email");
        assert!(caps.charge(&tenant, "a").is_none(), "the cap is one");
        drop(failed);
        let kept = caps.charge(&tenant, "a").expect("given back");
        kept.keep();
        assert!(caps.charge(&tenant, "a").is_none(), "kept");
    }

    /// Second review: a request that failed after its email's interval had passed gave back a
    /// whole interval, which later emails (counted from "now") had not borrowed: one email over
    /// the cap. Only what the failed email still holds is given back.
    #[test]
    fn a_late_failure_gives_back_nothing_the_bucket_refilled_already() {
        // Two per 2 s: one email's interval is 1 s (and the client is remembered for 2 s).
        let caps = ClientMail::new(&limits(2, Duration::from_secs(2)));
        let tenant = TenantId::default();
        let failed = caps.charge(&tenant, "a").expect("the first email");
        std::thread::sleep(Duration::from_millis(1100));
        // The failed email's interval has passed: the bucket holds two again.
        assert!(caps.allows(&tenant, "a") && caps.allows(&tenant, "a"));
        drop(failed);
        assert!(caps.charge(&tenant, "a").is_none(), "two per 2 s");
    }

    #[test]
    fn a_cap_of_zero_suppresses_every_email() {
        let caps = ClientMail::new(&limits(0, Duration::from_secs(3600)));
        assert!(!caps.allows(&TenantId::default(), "a"));
    }

    #[test]
    fn the_allowance_refills_over_the_window_and_idle_clients_are_forgotten() {
        let caps = ClientMail::new(&limits(2, Duration::from_secs(1)));
        let tenant = TenantId::default();
        assert!(caps.allows(&tenant, "a") && caps.allows(&tenant, "a"));
        assert!(!caps.allows(&tenant, "a"));
        // Half a window later: one more (a steady stream gets the cap per window).
        std::thread::sleep(Duration::from_millis(550));
        assert!(caps.allows(&tenant, "a"));
        assert!(!caps.allows(&tenant, "a"));
        assert!(caps.allows(&tenant, "b"));
        // A window without emails: forgotten (its bucket is full again anyway).
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(caps.clients(), 0);
        assert!(caps.allows(&tenant, "a") && caps.allows(&tenant, "a"));
    }

    #[test]
    fn a_flood_of_distinct_clients_stays_bounded() {
        let caps = ClientMail::with_capacity(&limits(3, Duration::from_secs(3600)), 1_000);
        let tenant = TenantId::default();
        for i in 0..10_000 {
            assert!(caps.allows(&tenant, &format!("client-{i}")));
        }
        let remembered = caps.clients();
        assert!((1..=1_000).contains(&remembered), "{remembered}");
    }
}
