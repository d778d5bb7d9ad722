-- One row per (tenant, method, route, key). Queries and the index each one uses:
--   claim insert, lookup, takeover, complete, release: the primary key (point lookups);
--   prune: oncely_idempotency_keys_expires_at (range scan in expiry order, LIMIT n).
-- Completion updates only unindexed columns, so with fillfactor 70 it is usually a HOT update.
CREATE TABLE oncely_idempotency_keys (
    tenant           text        NOT NULL,
    method           text        NOT NULL,
    route            text        NOT NULL,
    idem_key         text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    state            text        NOT NULL CHECK (state IN ('in_progress', 'completed', 'tombstoned')),
    fence            uuid        NOT NULL,
    lease_until      timestamptz,
    response_status  smallint,
    response_headers jsonb,
    response_body    bytea,
    tombstone_reason text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant, method, route, idem_key)
) WITH (fillfactor = 70);

CREATE INDEX oncely_idempotency_keys_expires_at ON oncely_idempotency_keys (expires_at);
