-- One row per (tenant, method, route, key); times are Unix milliseconds.
-- Queries and the index each one uses:
--   claim insert, lookup, takeover, complete, release: the primary key (point lookups);
--   prune: oncely_idempotency_keys_expires_at (range scan in expiry order, LIMIT n).
CREATE TABLE oncely_idempotency_keys (
    tenant           TEXT    NOT NULL,
    method           TEXT    NOT NULL,
    route            TEXT    NOT NULL,
    idem_key         TEXT    NOT NULL,
    fingerprint      BLOB    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed', 'tombstoned')),
    fence            BLOB    NOT NULL,
    lease_until      INTEGER,
    response_status  INTEGER,
    response_headers TEXT,
    response_body    BLOB,
    tombstone_reason TEXT,
    created_at       INTEGER NOT NULL,
    completed_at     INTEGER,
    expires_at       INTEGER NOT NULL,
    PRIMARY KEY (tenant, method, route, idem_key)
);

CREATE INDEX oncely_idempotency_keys_expires_at ON oncely_idempotency_keys (expires_at);
