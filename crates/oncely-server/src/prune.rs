//! Retention: deleting what is no longer needed, in small batches that never block traffic.
//!
//! | what | kept for | then |
//! |---|---|---|
//! | idempotency keys | `ONCELY_KEY_RETENTION` (24 h) after the first request | deleted; the key can be used afresh |
//! | sent and dead outbox jobs (with attempts) | `ONCELY_OUTBOX_RETENTION` (7 d) after they finished | deleted; the intent could be enqueued again |
//! | tokens | 7 days after they expired | deleted |
//! | codes (`POST /v1/exchange`), counted with tokens | until they expire (60 s) | deleted |
//! | email-cap and login-cap counters | two of the longer window | deleted |
//!
//! Every batch is one short statement (`LIMIT n`, on PostgreSQL `FOR UPDATE SKIP LOCKED`), so
//! pruning is safe while serving. `oncely serve` prunes every `ONCELY_PRUNE_INTERVAL`;
//! `oncely prune` does a full pass with a progress bar.

use std::time::Duration;

use oncely::store::KeyStore;
use oncely_outbox::JobStore;
use time::OffsetDateTime;

use crate::accounts::Accounts;
use crate::startup::Holds;

/// How long each kind of row is kept.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Finished outbox jobs.
    pub outbox: Duration,
    /// Tokens after their expiry.
    pub tokens: Duration,
    /// The longest window of the email and login caps (counters are kept two windows).
    pub cap_window: Duration,
}

impl Retention {
    /// Tokens are kept this long after their expiry (then no link can need them).
    pub const TOKENS: Duration = Duration::from_secs(7 * 24 * 3600);

    /// Finished outbox jobs kept for `outbox`, tokens for [`Self::TOKENS`], email-cap
    /// counters of `cap_window`s.
    pub fn new(outbox: Duration, cap_window: Duration) -> Self {
        Self {
            outbox,
            tokens: Self::TOKENS,
            cap_window,
        }
    }
}

/// Rows deleted by one pass, per table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Idempotency keys.
    pub keys: u64,
    /// Outbox jobs.
    pub jobs: u64,
    /// Tokens, and the codes links minted (one-time secrets alike).
    pub tokens: u64,
    /// Email-cap counters.
    pub rate_limits: u64,
}

impl Pruned {
    /// All rows.
    pub fn total(&self) -> u64 {
        self.keys + self.jobs + self.tokens + self.rate_limits
    }
}

/// The rows per batch.
pub const BATCH: u32 = 500;

/// Prunes everything expired, batch after batch; `progress(table, deleted_so_far)` after each.
pub async fn prune_all<A: Accounts>(
    accounts: &A,
    jobs: &A::Jobs,
    (retention, holds): (Retention, Holds),
    mut progress: impl FnMut(&'static str, u64),
) -> anyhow::Result<Pruned> {
    let mut pruned = Pruned::default();
    let window = retention.cap_window.as_secs().max(1) as i64;
    let before_window = OffsetDateTime::now_utc().unix_timestamp() - 2 * window;
    let tables: &[&str] = match holds {
        Holds::Service => &["keys", "jobs", "tokens", "rate_limits"],
        // A gateway's database: no outbox, no account table.
        Holds::KeysOnly => &["keys"],
    };
    for &table in tables {
        loop {
            let n = match table {
                "keys" => accounts.keys().prune(BATCH).await?,
                "jobs" => jobs.prune(retention.outbox, BATCH).await?,
                // Codes with tokens: what is left of a used link. A batch of each.
                "tokens" => {
                    accounts.prune_tokens(None, retention.tokens, BATCH).await?
                        + accounts.prune_codes(None, BATCH).await?
                }
                _ => accounts.prune_rate_limits(before_window, BATCH).await?,
            };
            let total = match table {
                "keys" => &mut pruned.keys,
                "jobs" => &mut pruned.jobs,
                "tokens" => &mut pruned.tokens,
                _ => &mut pruned.rate_limits,
            };
            *total += n;
            metrics::counter!("oncely_pruned_rows_total", "table" => table).increment(n);
            progress(table, *total);
            if n < u64::from(BATCH) {
                break;
            }
            // Let live traffic go first between batches.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(pruned)
}
