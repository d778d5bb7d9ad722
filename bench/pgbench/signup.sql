-- The statements a new signup committed through oncely before issue 20 (transactional layer,
-- PostgreSQL): the replay probe, then one transaction with the user read back and each counter
-- in a statement of its own. Kept as the first row of the results table so that its ratio
-- compares with earlier runs; it is not the target's baseline, which is signup-minimal.sql
-- (only the rows a signup must write). oncely now writes the user, its counters and reads the
-- webhook endpoints in one statement (accounts/postgres.rs, signup_user_counted).
\set n random(1, 2000000000)
\set m random(1, 2000000000)
-- The read that answers a retry without a transaction; a new key finds nothing.
SELECT fingerprint, state FROM oncely_idempotency_keys
 WHERE tenant = 'default' AND method = 'POST' AND route = '/v1/signup' AND idem_key = 'pg-:n-:m';
BEGIN;
SET LOCAL lock_timeout = 1500;
SET LOCAL idle_in_transaction_session_timeout = 30000;
SET LOCAL statement_timeout = 30000;
INSERT INTO oncely_idempotency_keys (tenant, method, route, idem_key, fingerprint, state, fence, lease_until, expires_at)
VALUES ('default', 'POST', '/v1/signup', 'pg-:n-:m', decode(md5('f:n:m') || md5(':m'), 'hex'), 'in_progress', gen_random_uuid(),
        now() + make_interval(secs => 30), now() + make_interval(secs => 86400))
ON CONFLICT (tenant, method, route, idem_key) DO NOTHING RETURNING fence;
INSERT INTO oncely_users (id, tenant, email, password_hash, source)
VALUES (gen_random_uuid(), 'default', 'pg-:n-:m@example.com', NULL, NULL) ON CONFLICT (tenant, email) DO NOTHING;
SELECT id AS uid, status = 'verified' AS verified FROM oncely_users WHERE tenant = 'default' AND email = 'pg-:n-:m@example.com' \gset
INSERT INTO oncely_rate_limits AS r (tenant, bucket, window_start, count) VALUES ('default', 'address:' || md5(':n:m'), 0, 1)
ON CONFLICT (tenant, bucket, window_start) DO UPDATE SET count = r.count + 1 RETURNING count;
INSERT INTO oncely_rate_limits AS r (tenant, bucket, window_start, count) VALUES ('default', 'client:pgbench', 0, 1)
ON CONFLICT (tenant, bucket, window_start) DO UPDATE SET count = r.count + 1 RETURNING count;
UPDATE oncely_tokens SET superseded_at = now()
 WHERE user_id = ':uid' AND flow = 'verification' AND true AND consumed_at IS NULL AND superseded_at IS NULL;
INSERT INTO oncely_tokens (id, tenant, user_id, email, flow, token_hash, expires_at)
VALUES (gen_random_uuid(), 'default', ':uid', NULL, 'verification', decode(md5('t:n:m') || md5('u:n:m'), 'hex'), now() + interval '24 hours');
WITH inserted AS (
    INSERT INTO oncely_outbox (operation_key, kind, payload, delivery_key, not_after)
    VALUES ('verification:default:' || ':uid' || ':pg-:n-:m', 'email.verification', '{"token_id":"x","suppressed":null}'::text::jsonb,
            gen_random_uuid(), now() + interval '24 hours')
    ON CONFLICT (operation_key) DO NOTHING RETURNING id)
SELECT id FROM inserted, pg_notify('oncely_outbox', 'email.verification');
UPDATE oncely_idempotency_keys
   SET state = 'completed', response_status = 202, response_headers = '[["content-type","application/json"]]'::jsonb,
       response_body = '\x7b7d', tombstone_reason = NULL, completed_at = now(), lease_until = NULL
 WHERE tenant = 'default' AND method = 'POST' AND route = '/v1/signup' AND idem_key = 'pg-:n-:m'
   AND fence IS NOT NULL AND state = 'in_progress';
COMMIT;
