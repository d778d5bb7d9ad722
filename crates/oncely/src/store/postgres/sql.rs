//! The PostgreSQL statements of the key store. SQLite's, under the same names and with the same
//! parameters (see `store::sql::Statements`), are in `store/sqlite/sql.rs`.
//!
//! Where the dialects differ, and why:
//! - "now" is `COALESCE($n, now())`: the database's clock unless the store's clock injects a
//!   time (so that API processes on many machines agree on when a lease or a retention ends).
//!   SQLite stores Unix milliseconds and always binds the process's clock.
//! - times are `timestamptz`, durations arrive in milliseconds (`make_interval`).
//! - CLAIM inserts or reads in one statement (a data-modifying CTE); SQLite has none, so its
//!   CLAIM only inserts and the store reads the row in the same `BEGIN IMMEDIATE` transaction.
//! - PRUNE picks its batch by `ctid` with `FOR UPDATE SKIP LOCKED`, so it never waits for live
//!   traffic; SQLite has one writer and picks by `rowid`.
//! - `response_status` is a `smallint` and `response_headers` a `jsonb`: both cast on the way
//!   in and out.
//!
//! Each query names the index of `migrations/postgres/0001_idempotency_keys.sql` it uses.

// Insert-or-read in one round trip: the insert takes no row lock and writes nothing when the key
// exists, and the read (from the statement's snapshot) returns the existing row. If a concurrent
// request committed the key after the snapshot was taken, neither part returns a row and the
// caller simply asks again. Index: the primary key (tenant, method, route, idem_key).
pub(super) const CLAIM: &str = "
    WITH inserted AS (
        INSERT INTO oncely_idempotency_keys
            (tenant, method, route, idem_key, fingerprint, state, fence, lease_until, expires_at,
             created_at)
        VALUES ($1, $2, $3, $4, $5, 'in_progress', $6,
                COALESCE($9, now()) + make_interval(secs => $7 / 1000.0),
                COALESCE($9, now()) + make_interval(secs => $8 / 1000.0),
                COALESCE($9, now()))
        ON CONFLICT (tenant, method, route, idem_key) DO NOTHING
        RETURNING fingerprint, state
    )
    SELECT true AS inserted, fingerprint, state, true AS lease_active, false AS expired,
           NULL::int8 AS response_status, NULL::text AS response_headers,
           NULL::bytea AS response_body, NULL::text AS tombstone_reason,
           NULL::int8 AS expires_in_ms
      FROM inserted
    UNION ALL
    SELECT false, fingerprint, state, COALESCE(lease_until > COALESCE($9, now()), false),
           expires_at <= COALESCE($9, now()), response_status::int8, response_headers::text,
           response_body, tombstone_reason,
           floor(extract(epoch FROM expires_at - COALESCE($9, now())) * 1000)::int8
      FROM oncely_idempotency_keys
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4
       AND NOT EXISTS (SELECT 1 FROM inserted)";

// Takes over a row whose retention ended, or whose lease ended (same request only). The guard
// is re-checked under the row lock, so of two racing takeovers exactly one wins.
pub(super) const TAKEOVER: &str = "
    UPDATE oncely_idempotency_keys
       SET fingerprint = $5, state = 'in_progress', fence = $6,
           lease_until = COALESCE($9, now()) + make_interval(secs => $7 / 1000.0),
           expires_at = COALESCE($9, now()) + make_interval(secs => $8 / 1000.0),
           created_at = COALESCE($9, now()),
           response_status = NULL, response_headers = NULL, response_body = NULL,
           tombstone_reason = NULL, completed_at = NULL
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4
       AND (expires_at <= COALESCE($9, now())
            OR (state = 'in_progress' AND lease_until <= COALESCE($9, now())
                AND fingerprint = $5))";

pub(super) const SELECT: &str = "
    SELECT fingerprint, state, COALESCE(lease_until > COALESCE($5, now()), false) AS lease_active,
           expires_at <= COALESCE($5, now()) AS expired, response_status::int8 AS response_status,
           response_headers::text AS response_headers, response_body, tombstone_reason,
           floor(extract(epoch FROM expires_at - COALESCE($5, now())) * 1000)::int8
               AS expires_in_ms
      FROM oncely_idempotency_keys
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4";

pub(super) const COMPLETE: &str = "
    UPDATE oncely_idempotency_keys
       SET state = $6, response_status = $7::int2, response_headers = $8::jsonb,
           response_body = $9, tombstone_reason = $10, completed_at = COALESCE($11, now()),
           lease_until = NULL
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4
       AND fence = $5 AND state = 'in_progress'";

pub(super) const RENEW: &str = "
    UPDATE oncely_idempotency_keys
       SET lease_until = COALESCE($7, now()) + make_interval(secs => $6 / 1000.0)
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4
       AND fence = $5 AND state = 'in_progress'";

pub(super) const RELEASE: &str = "
    DELETE FROM oncely_idempotency_keys
     WHERE tenant = $1 AND method = $2 AND route = $3 AND idem_key = $4
       AND fence = $5 AND state = 'in_progress'";

// Index: oncely_idempotency_keys_expires_at. SKIP LOCKED: never waits for live traffic.
pub(super) const PRUNE: &str = "
    DELETE FROM oncely_idempotency_keys WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM oncely_idempotency_keys
         WHERE expires_at <= COALESCE($1, now())
           AND (state <> 'in_progress' OR lease_until <= COALESCE($1, now()))
         ORDER BY expires_at
         LIMIT $2
           FOR UPDATE SKIP LOCKED))";

// The shared secret (`store::shared_secret`): one row each, `id = 1`.
// The no-op update makes RETURNING give the stored row when it exists.
pub(super) const DEVELOPMENT_SECRET: &str = "
    INSERT INTO oncely_shared_development_secret (id, secret) VALUES (1, $1)
    ON CONFLICT (id) DO UPDATE SET secret = oncely_shared_development_secret.secret
    RETURNING secret";

pub(super) const SECRET_CHECK: &str =
    "SELECT current_mac, previous_mac, retired_macs FROM oncely_shared_secret_check WHERE id = 1";

pub(super) const ADD_SECRET_CHECK: &str = "
    INSERT INTO oncely_shared_secret_check (id, current_mac, previous_mac, retired_macs)
    VALUES (1, $1, $2, $3)
    ON CONFLICT (id) DO NOTHING";

pub(super) const REPLACE_SECRET_CHECK: &str = "
    UPDATE oncely_shared_secret_check SET current_mac = $1, previous_mac = $2, retired_macs = $3
     WHERE id = 1 AND current_mac = $4";
