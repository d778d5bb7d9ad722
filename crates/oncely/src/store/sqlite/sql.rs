//! The SQLite statements of the key store. PostgreSQL's, under the same names and with the same
//! parameters (see `store::sql::Statements`), are in `store/postgres/sql.rs`.
//!
//! Where the dialects differ, and why:
//! - times are Unix milliseconds (`INTEGER`), and "now" is always bound: the store's clock,
//!   this process's by default (one machine owns the file, so there is no other clock to agree
//!   with). Durations arrive in milliseconds and are simply added.
//! - CLAIM only inserts: SQLite has no data-modifying CTE to read the existing row in the same
//!   statement, so the store reads it with SELECT. Every claim runs in a `BEGIN IMMEDIATE`
//!   transaction (one writer at a time), so the insert, the read and the takeover are one atomic
//!   step and never race.
//! - PRUNE picks its batch by `rowid`; with one writer there is nothing to skip (PostgreSQL
//!   uses `ctid` and `SKIP LOCKED`).
//! - booleans are integers (`COALESCE(…, 0)`).
//!
//! Each query names the index of `migrations/sqlite/0001_idempotency_keys.sql` it uses.

// Index: the primary key (tenant, method, route, idem_key).
pub(super) const CLAIM: &str = "
    INSERT INTO oncely_idempotency_keys
        (tenant, method, route, idem_key, fingerprint, state, fence, lease_until, expires_at,
         created_at)
    VALUES (?1, ?2, ?3, ?4, ?5, 'in_progress', ?6, ?9 + ?7, ?9 + ?8, ?9)
    ON CONFLICT (tenant, method, route, idem_key) DO NOTHING";

// Takes over a row whose retention ended, or whose lease ended (same request only).
pub(super) const TAKEOVER: &str = "
    UPDATE oncely_idempotency_keys
       SET fingerprint = ?5, state = 'in_progress', fence = ?6, lease_until = ?9 + ?7,
           expires_at = ?9 + ?8, created_at = ?9,
           response_status = NULL, response_headers = NULL, response_body = NULL,
           tombstone_reason = NULL, completed_at = NULL
     WHERE tenant = ?1 AND method = ?2 AND route = ?3 AND idem_key = ?4
       AND (expires_at <= ?9
            OR (state = 'in_progress' AND lease_until <= ?9 AND fingerprint = ?5))";

pub(super) const SELECT: &str = "
    SELECT fingerprint, state, COALESCE(lease_until > ?5, 0) AS lease_active,
           expires_at <= ?5 AS expired, response_status, response_headers, response_body,
           tombstone_reason, expires_at - ?5 AS expires_in_ms
      FROM oncely_idempotency_keys
     WHERE tenant = ?1 AND method = ?2 AND route = ?3 AND idem_key = ?4";

pub(super) const COMPLETE: &str = "
    UPDATE oncely_idempotency_keys
       SET state = ?6, response_status = ?7, response_headers = ?8, response_body = ?9,
           tombstone_reason = ?10, completed_at = ?11, lease_until = NULL
     WHERE tenant = ?1 AND method = ?2 AND route = ?3 AND idem_key = ?4
       AND fence = ?5 AND state = 'in_progress'";

pub(super) const RENEW: &str = "
    UPDATE oncely_idempotency_keys
       SET lease_until = ?7 + ?6
     WHERE tenant = ?1 AND method = ?2 AND route = ?3 AND idem_key = ?4
       AND fence = ?5 AND state = 'in_progress'";

pub(super) const RELEASE: &str = "
    DELETE FROM oncely_idempotency_keys
     WHERE tenant = ?1 AND method = ?2 AND route = ?3 AND idem_key = ?4
       AND fence = ?5 AND state = 'in_progress'";

// Index: oncely_idempotency_keys_expires_at.
pub(super) const PRUNE: &str = "
    DELETE FROM oncely_idempotency_keys WHERE rowid IN (
        SELECT rowid FROM oncely_idempotency_keys
         WHERE expires_at <= ?1 AND (state <> 'in_progress' OR lease_until <= ?1)
         ORDER BY expires_at
         LIMIT ?2)";

// The shared secret (`store::shared_secret`): as PostgreSQL's, with `?n` parameters.
pub(super) const DEVELOPMENT_SECRET: &str = "
    INSERT INTO oncely_shared_development_secret (id, secret) VALUES (1, ?1)
    ON CONFLICT (id) DO UPDATE SET secret = oncely_shared_development_secret.secret
    RETURNING secret";

pub(super) const SECRET_CHECK: &str =
    "SELECT current_mac, previous_mac, retired_macs FROM oncely_shared_secret_check WHERE id = 1";

pub(super) const ADD_SECRET_CHECK: &str = "
    INSERT INTO oncely_shared_secret_check (id, current_mac, previous_mac, retired_macs)
    VALUES (1, ?1, ?2, ?3)
    ON CONFLICT (id) DO NOTHING";

pub(super) const REPLACE_SECRET_CHECK: &str = "
    UPDATE oncely_shared_secret_check SET current_mac = ?1, previous_mac = ?2, retired_macs = ?3
     WHERE id = 1 AND current_mac = ?4";
