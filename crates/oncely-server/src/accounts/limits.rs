//! The email caps' counters: one email counted on the per-address rows.

use super::{AccountError, Accounts};
use crate::limits::email::EmailCount;

/// Counts `count`'s email on the per-address counters in `conn`'s transaction: this address
/// from this client (0 for an unknown client) and, unless the client's caps stopped it, this
/// address from all clients ([`Accounts::count_email_pair`], or [`Accounts::count_email`] of
/// the address alone for an unknown client).
pub async fn count_in<A: Accounts>(
    conn: &mut <A::Database as sqlx::Database>::Connection,
    tenant: &str,
    count: &EmailCount,
) -> Result<(i64, Option<i64>), AccountError> {
    match &count.pair {
        Some(pair) => {
            let buckets = (pair.as_str(), count.address.as_str());
            let caps = (count.per_address, count.client_allowed);
            A::count_email_pair(conn, tenant, buckets, count.window_start, caps).await
        }
        None => {
            let to_address =
                A::count_email(conn, tenant, &count.address, count.window_start).await?;
            Ok((0, Some(to_address)))
        }
    }
}
