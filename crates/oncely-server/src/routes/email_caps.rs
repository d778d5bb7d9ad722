//! The caps on emails (per address from one client, per address from all clients, per client):
//! every route that emails counts its email here, whether or not the address has an account,
//! and learns whether the email must be suppressed. The counters touched depend on the
//! client's own history, never on the address having an account.

use std::time::Duration;

use oncely::TenantId;
use time::OffsetDateTime;

use super::AppState;
use crate::accounts::Accounts;
use crate::client_addr::CallerAddr;
use crate::email::EmailAddress;

/// How many times its total a per-address cap lets through at most, first attempts of new
/// clients included (they pass the total itself, so that strangers cannot lock an owner out).
pub const HARD_CEILING: i64 = 2;

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

/// Counts this email for the address from this client and for this client (whenever the client
/// is known), then — if those let it through — for the address from all clients, and says
/// whether it must be suppressed, and why. The per-address cap is per client: a stranger who
/// exhausts it for the owner's address exhausts it only for itself; the total ceiling needs
/// many clients. (Which counters a request touches depends on the client's own history, never
/// on whether the address has an account.)
pub async fn suppression<A: Accounts>(
    conn: &mut <A::Database as sqlx::Database>::Connection,
    state: &AppState<A>,
    tenant: &TenantId,
    email: &EmailAddress,
    caller: &CallerAddr,
) -> anyhow::Result<Option<String>> {
    let limits = state.limits;
    let window = limits.window.as_secs().max(1) as i64;
    let window_start = OffsetDateTime::now_utc().unix_timestamp() / window * window;
    // Counts one more email in a bucket. Buckets are keyed hashes: the limits table never holds
    // an address.
    let mut count = async |kind: &str, value: &str| {
        let mac = state
            .secret
            .mac("oncely/rate-limit/v1", &[kind.as_bytes(), value.as_bytes()]);
        let bucket = format!("{kind}:{}", hex::encode(&mac[..16]));
        A::count_email(&mut *conn, tenant.as_str(), &bucket, window_start).await
    };
    let (to_address_from_client, from_client) = match caller.bucket() {
        Some(client) => {
            let pair = format!("{}\n{client}", email.as_str());
            let to_address_from_client = count("address-client", &pair).await?;
            (to_address_from_client, count("client", &client).await?)
        }
        None => (0, 0),
    };
    let over = |limit, cap: u32, whom| {
        let reason = format!(
            "suppressed: over {cap} emails per {:?} {whom}",
            limits.window
        );
        Some((limit, reason))
    };
    let reason = if to_address_from_client > i64::from(limits.per_address) {
        over("address", limits.per_address, "to this address")
    } else if from_client > i64::from(limits.per_client) {
        over("client", limits.per_client, "from this client")
    } else {
        // Only emails a client's own caps let through count toward the mailbox's total: a
        // client hammering one address past its share cannot use up everyone else's. And a
        // client's first email to the address in the window always passes the total: however
        // many clients fill it, the owner (a client that has asked for nothing yet) still gets
        // its link — a mail bomb gains one email per client address it controls, and no more
        // than the hard ceiling in all.
        let to_address = count("address", email.as_str()).await?;
        let first_from_client = to_address_from_client == 1;
        // But not past the hard ceiling: clients are cheap (an IPv6 prefix holds thousands, a
        // backend may name any address), so their first emails together stop there.
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
