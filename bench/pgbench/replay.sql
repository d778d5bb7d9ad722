-- The primary-key lookup that answers a replay (keys seeded by bench/run). Baseline for replays.
\set k random(1, 200)
SELECT fingerprint, state, COALESCE(lease_until > now(), false) AS lease_active, expires_at <= now() AS expired,
       response_status::int8 AS response_status, response_headers::text AS response_headers, response_body, tombstone_reason
  FROM oncely_idempotency_keys WHERE tenant = 'default' AND method = 'POST' AND route = '/v1/signup' AND idem_key = 'pgr-:k';
