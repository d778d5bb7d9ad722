//! Finished keys kept in memory, so that repeats of a finished request are answered without the
//! database.
//!
//! A row that is completed or tombstoned never changes until its retention ends: only then can
//! a claim take it over or a prune delete it, and a key is released only while in progress. So
//! an entry is a copy of such a row, read from the database (by the replay probe or a claim),
//! that lives no longer than the row's retention as the read told it ([`Record::expires_at`]:
//! the time of the read plus what the database said remained) — never a row in progress, never
//! past its expiry. Bounded by bytes (bodies, headers, keys), least recently and least often
//! used first out.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use moka::Expiry;

use crate::Scope;
use crate::store::{Record, RecordState};

/// A bounded in-process cache of finished keys, shared by the layers it is given to (give it
/// only to layers on the same key store: its entries are keyed by scope alone). Clones share it.
///
/// Each process keeps its own: processes that share a database agree anyway, because a cached
/// row cannot change before it expires.
#[derive(Clone)]
pub struct ReplayCache {
    entries: moka::sync::Cache<Scope, Arc<Entry>>,
}

/// A finished row and when it stops being served.
struct Entry {
    record: Record,
    /// The row's expiry, by the store's clock.
    expires_at: SystemTime,
    /// The same, on this process's monotonic clock (moka evicts by it).
    evict_after: Duration,
    weight: u32,
}

/// Each entry lives until its row's retention ends.
struct UntilRowExpiry;

impl Expiry<Scope, Arc<Entry>> for UntilRowExpiry {
    fn expire_after_create(
        &self,
        _key: &Scope,
        entry: &Arc<Entry>,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(entry.evict_after)
    }
}

/// What an entry costs besides its bytes: the cache's own bookkeeping (its map slot, the access
/// and write order, the expiry timer) and the allocations of the scope and the record — about
/// 1.5 KiB in all, measured as the process's resident memory per cached key (the generic
/// layer on SQLite, 20,000 keys with 90-byte answers: 1,482 bytes each).
const OVERHEAD: usize = 1536;

impl ReplayCache {
    /// A cache of at most `max_bytes` of entries: response bodies, headers, scopes, and
    /// 1.5 KiB of overhead each (so 8 MiB hold about 5,000 small answers, fewer large ones).
    /// The allocator may keep more than that resident, especially for large bodies.
    pub fn new(max_bytes: u64) -> Self {
        Self {
            entries: moka::sync::Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|_scope: &Scope, entry: &Arc<Entry>| entry.weight)
                .expire_after(UntilRowExpiry)
                .build(),
        }
    }

    /// The finished row of `scope`, if this cache holds it and its retention has not ended by
    /// `now` (the store's clock).
    pub(crate) fn get(&self, scope: &Scope, now: SystemTime) -> Option<Record> {
        let entry = self.entries.get(scope)?;
        if now < entry.expires_at {
            return Some(entry.record.clone());
        }
        self.entries.invalidate(scope);
        None
    }

    /// Keeps `record` of `scope` if it is finished and says when it expires, until then (`now`:
    /// the store's clock).
    pub(crate) fn remember(&self, scope: &Scope, record: &Record, now: SystemTime) {
        let body = match &record.state {
            RecordState::InProgress { .. } => return,
            RecordState::Completed(stored) => {
                stored.body.len()
                    + stored
                        .headers
                        .iter()
                        .map(|(name, value)| name.len() + value.len() + 16)
                        .sum::<usize>()
            }
            RecordState::Tombstoned { reason } => reason.len(),
        };
        let Some(expires_at) = record.expires_at else {
            return;
        };
        let Ok(evict_after) = expires_at.duration_since(now) else {
            return;
        };
        let key_bytes = scope.tenant.as_str().len()
            + scope.method.len()
            + scope.route.len()
            + scope.key.as_str().len();
        let weight = u32::try_from(body + key_bytes + OVERHEAD).unwrap_or(u32::MAX);
        let entry = Entry {
            record: record.clone(),
            expires_at,
            evict_after,
            weight,
        };
        self.entries.insert(scope.clone(), Arc::new(entry));
    }

    /// The bytes its entries weigh now (after pending maintenance).
    pub fn weighted_size(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.weighted_size()
    }

    /// How many entries it holds now (after pending maintenance).
    pub fn entry_count(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.entry_count()
    }
}

impl std::fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayCache")
            .field("max_bytes", &self.entries.policy().max_capacity())
            .finish_non_exhaustive()
    }
}
