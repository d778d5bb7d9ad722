//! The caps on emails (per address from one client, per address from all clients, per client):
//! every route that emails counts its email here, whether or not the address has an account,
//! and learns whether the email must be suppressed. The counters touched depend on the
//! client's own history, never on the address having an account. What counts and how:
//! [`crate::limits::mail`].

use oncely::TenantId;

use super::AppState;
use crate::accounts::{Accounts, count_in};
use crate::client_addr::CallerAddr;
use crate::email::EmailAddress;
use crate::limits::mail::{ClientCharge, MailCount};

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
) -> anyhow::Result<(Option<String>, ClientCharge)> {
    let count = email_count(state, tenant, email, caller);
    let counted = count_in::<A>(conn, tenant.as_str(), &count).await?;
    let verdict = count.verdict(&state.limits, counted)?;
    Ok((verdict, count.charge))
}

/// One email of `caller` to `email` ([`MailCount::new`]), under this service's caps, counted
/// against the client's cap in this process.
pub fn email_count<A: Accounts>(
    state: &AppState<A>,
    tenant: &TenantId,
    email: &EmailAddress,
    caller: &CallerAddr,
) -> MailCount {
    let caps = (&state.limits, &state.client_mail);
    MailCount::new(caps, &state.secret, tenant, email, caller)
}
