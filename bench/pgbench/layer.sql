-- The generic layer's writes for a new key on PostgreSQL, as it issues them: two autocommit
-- statements on a pooled connection (no transaction around them, no read before the claim).
-- 1. CLAIM (crates/oncely/src/store/postgres/sql.rs), the insert-or-read in one statement;
-- 2. COMPLETE, the fenced update that stores the answer.
-- The texts are the store's (as of commit 40c4e2e) with the parameters written in, as the layer
-- binds them for layer_target's /keyed route: tenant 'default', method POST, route '/keyed', a
-- 32-byte fingerprint, a fresh fence, lease 30 s and retention 24 h in milliseconds, "now" NULL
-- (the database's clock), then status 201, the JSON content type and the handler's body. For a
-- new key the replay cache holds nothing and no other statement runs; the handler runs between
-- the two and writes nothing.
-- Baseline of the "generic layer" row of bench/run (target 0.8). Written with `'…' || :n` so
-- that it runs with `-M prepared` (bench/run prepares it, as sqlx does) and with the simple
-- protocol.
\set n random(1, 2000000000)
\set m random(1, 2000000000)
WITH inserted AS (
    INSERT INTO oncely_idempotency_keys
        (tenant, method, route, idem_key, fingerprint, state, fence, lease_until, expires_at,
         created_at)
    VALUES ('default', 'POST', '/keyed', 'layer-' || :n || '-' || :m, decode(md5('f' || :n || '-' || :m) || md5('g' || :m), 'hex'),
            'in_progress', md5('fence' || :n || '-' || :m)::uuid,
            COALESCE(NULL::timestamptz, now()) + make_interval(secs => 30000 / 1000.0),
            COALESCE(NULL::timestamptz, now()) + make_interval(secs => 86400000 / 1000.0),
            COALESCE(NULL::timestamptz, now()))
    ON CONFLICT (tenant, method, route, idem_key) DO NOTHING
    RETURNING fingerprint, state
)
SELECT true AS inserted, fingerprint, state, true AS lease_active, false AS expired,
       NULL::int8 AS response_status, NULL::text AS response_headers,
       NULL::bytea AS response_body, NULL::text AS tombstone_reason,
       NULL::int8 AS expires_in_ms
  FROM inserted
UNION ALL
SELECT false, fingerprint, state, COALESCE(lease_until > COALESCE(NULL::timestamptz, now()), false),
       expires_at <= COALESCE(NULL::timestamptz, now()), response_status::int8, response_headers::text,
       response_body, tombstone_reason,
       floor(extract(epoch FROM expires_at - COALESCE(NULL::timestamptz, now())) * 1000)::int8
  FROM oncely_idempotency_keys
 WHERE tenant = 'default' AND method = 'POST' AND route = '/keyed' AND idem_key = 'layer-' || :n || '-' || :m
   AND NOT EXISTS (SELECT 1 FROM inserted);
UPDATE oncely_idempotency_keys
   SET state = 'completed', response_status = 201::int2, response_headers = '[["content-type","application/json"]]'::jsonb,
       response_body = '\x7b226f6b223a747275657d'::bytea, tombstone_reason = NULL, completed_at = COALESCE(NULL::timestamptz, now()),
       lease_until = NULL
 WHERE tenant = 'default' AND method = 'POST' AND route = '/keyed' AND idem_key = 'layer-' || :n || '-' || :m
   AND fence = md5('fence' || :n || '-' || :m)::uuid AND state = 'in_progress';
