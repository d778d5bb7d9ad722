//! The email caps' counters: one email counted on the per-address rows.

use super::{AccountError, Accounts};
use crate::limits::mail::MailCount;

/// Counts `count`'s email on the per-address counters in `conn`'s transaction: this address
/// from this client (0 for an unknown client) and, unless the client's caps stopped it, this
/// address from all clients ([`Accounts::count_email_pair`], or [`Accounts::count_email`] of
/// the address alone for an unknown client).
pub async fn count_in<A: Accounts>(
    conn: &mut <A::Database as sqlx::Database>::Connection,
    tenant: &str,
    count: &MailCount,
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

/// The statements of the email and login caps' counters. One set per dialect (`postgres.rs`,
/// `sqlite.rs`), in [`Statements`](super::Statements).
#[derive(Debug, Clone, Copy)]
pub struct LimitStatements {
    /// Binds tenant, bucket, window_start. Takes one back from a counter (an attempt that
    /// turned out not to count); never below 0.
    pub uncount: &'static str,
    /// Binds tenant, bucket, window_start. Counts one more email; returns the count (64-bit).
    pub count_email: &'static str,
    /// Where the dialect can in one statement (data-modifying CTEs): binds tenant, the
    /// address-and-client bucket, the address bucket, window_start, the per-address cap
    /// (64-bit), whether the client's own cap let the email through. Counts one more email to
    /// the address from the client, and — if that is within the cap and the client's cap let
    /// it through — one more to the address; returns both counts (64-bit; the second NULL if
    /// not counted). `None`: [`Self::count_email`] twice.
    pub count_email_pair: Option<&'static str>,
    /// Binds before_window, limit. Deletes up to `limit` counters of earlier windows.
    pub prune_rate_limits: &'static str,
}
