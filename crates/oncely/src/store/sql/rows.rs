//! A key row as both dialects read it, and the columns both write.

use bytes::Bytes;

use crate::Fingerprint;
use crate::store::{Completion, Record, RecordState, StoreError, StoredResponse};

/// A key row as read, with the two clock comparisons made by the statement.
#[derive(Debug, sqlx::FromRow)]
pub struct KeyRow {
    fingerprint: Vec<u8>,
    state: String,
    lease_active: bool,
    expired: bool,
    response_status: Option<i64>,
    response_headers: Option<String>,
    response_body: Option<Vec<u8>>,
    tombstone_reason: Option<String>,
    /// How long its retention still runs, in milliseconds, by the statement's clock (the
    /// database's, or the injected one); `NULL` for a row the statement inserted.
    #[sqlx(default)]
    expires_in_ms: Option<i64>,
}

/// A key row that exists: its record and whether its retention has passed.
pub(crate) struct Found {
    pub(crate) record: Record,
    pub(crate) expired: bool,
}

impl Found {
    /// Whether a claim with `fingerprint` may take this row over: its retention ended, or it is
    /// in progress with an expired lease and the same request.
    pub(crate) fn claimable_by(&self, fingerprint: &Fingerprint) -> bool {
        self.expired
            || (matches!(
                self.record.state,
                RecordState::InProgress {
                    lease_active: false
                }
            ) && self.record.fingerprint == *fingerprint)
    }
}

impl KeyRow {
    /// The row read by a statement that started after `read_at` (by the store's clock).
    pub(crate) fn into_found(self, read_at: std::time::SystemTime) -> Result<Found, StoreError> {
        let fingerprint =
            Fingerprint::from_bytes(&self.fingerprint).ok_or(StoreError::Corrupt("fingerprint"))?;
        let state = match self.state.as_str() {
            "in_progress" => RecordState::InProgress {
                lease_active: self.lease_active,
            },
            "completed" => RecordState::Completed(StoredResponse {
                status: self
                    .response_status
                    .and_then(|status| u16::try_from(status).ok())
                    .ok_or(StoreError::Corrupt("response status"))?,
                headers: serde_json::from_str(self.response_headers.as_deref().unwrap_or("[]"))
                    .map_err(|_| StoreError::Corrupt("response headers"))?,
                body: Bytes::from(self.response_body.unwrap_or_default()),
            }),
            "tombstoned" => RecordState::Tombstoned {
                reason: self.tombstone_reason.unwrap_or_default(),
            },
            _ => return Err(StoreError::Corrupt("state")),
        };
        Ok(Found {
            record: Record {
                fingerprint,
                state,
                // In this process's time: what remained by the statement's clock, counted from
                // before the statement, so never later than the row's own expiry.
                expires_at: self
                    .expires_in_ms
                    .map(|ms| read_at + std::time::Duration::from_millis(ms.max(0) as u64)),
            },
            expired: self.expired,
        })
    }
}

/// A [`Completion`] as the columns COMPLETE writes.
pub(crate) struct CompletionColumns<'a> {
    pub(crate) state: &'static str,
    pub(crate) status: Option<i64>,
    pub(crate) headers: Option<String>,
    pub(crate) body: Option<&'a [u8]>,
    pub(crate) reason: Option<&'a str>,
}

impl<'a> From<&'a Completion> for CompletionColumns<'a> {
    fn from(completion: &'a Completion) -> Self {
        match completion {
            Completion::Response(r) => Self {
                state: "completed",
                status: Some(i64::from(r.status)),
                headers: Some(serde_json::to_string(&r.headers).expect("headers always serialize")),
                body: Some(&r.body),
                reason: None,
            },
            Completion::Tombstone { reason } => Self {
                state: "tombstoned",
                status: None,
                headers: None,
                body: None,
                reason: Some(reason),
            },
        }
    }
}
