-- The commit limit of a signup: only the rows a signup must write, in ONE transaction — the
-- idempotency key claimed (inserted in progress), the user, the verification token, the outbox
-- job that mails it, and the key completed with the stored answer. Every value is unique to the
-- transaction (no row is shared between requests): no rate-limit counter, no pg_notify, no
-- replay probe, no session timeouts. Baseline of the signup rows of bench/run (target 0.8).
-- Columns: crates/oncely/migrations/postgres/0001, crates/oncely-server/migrations/postgres/
-- 0001, 0002, 0004, 0008, 0010 and crates/oncely-outbox/migrations/postgres/0001, 0008.
-- Written with `'…' || :n` instead of `'…:n'`, and no `:word` inside a literal, so that it runs
-- with `-M prepared` too (bench/run prepares it, as sqlx does; pgbench would put `$1` inside
-- a quoted literal).
\set n random(1, 2000000000)
\set m random(1, 2000000000)
BEGIN;
INSERT INTO oncely_idempotency_keys (tenant, method, route, idem_key, fingerprint, state, fence, lease_until, expires_at, created_at)
VALUES ('default', 'POST', '/v1/signup', 'min-' || :n || '-' || :m, decode(md5('f' || :n || '-' || :m) || md5('g' || :m), 'hex'),
        'in_progress', md5('fence' || :n || '-' || :m)::uuid, now() + interval '30 seconds', now() + interval '24 hours', now())
ON CONFLICT (tenant, method, route, idem_key) DO NOTHING RETURNING fence;
INSERT INTO oncely_users (id, tenant, email, source, created_at)
VALUES (md5('user' || :n || '-' || :m)::uuid, 'default', 'min-' || :n || '-' || :m || '@example.com', NULL, now())
ON CONFLICT (tenant, email) DO NOTHING;
INSERT INTO oncely_tokens (id, tenant, user_id, email, flow, token_hash, expires_at, created_at, password_hash, return_to, locale)
VALUES (md5('token' || :n || '-' || :m)::uuid, 'default', md5('user' || :n || '-' || :m)::uuid, NULL, 'verification',
        decode(md5('t' || :n || '-' || :m) || md5('u' || :m), 'hex'), now() + interval '24 hours', now(), NULL, NULL, 'en');
INSERT INTO oncely_outbox (operation_key, kind, payload, delivery_key, not_after, run_after, created_at, partition_key)
VALUES ('verification:' || 'default' || ':' || md5('user' || :n || '-' || :m)::uuid || ':' || md5('token' || :n || '-' || :m)::uuid,
        'email.verification', jsonb_build_object('token_id', md5('token' || :n || '-' || :m)::uuid, 'suppressed', NULL),
        gen_random_uuid(), now() + interval '24 hours', now(), now(), NULL)
ON CONFLICT (operation_key) DO NOTHING RETURNING id;
UPDATE oncely_idempotency_keys
   SET state = 'completed', response_status = 202, response_headers = '[["content-type","application/json"]]'::jsonb,
       response_body = '\x7b22737461747573223a226163636570746564227d'::bytea, tombstone_reason = NULL, completed_at = now(), lease_until = NULL
 WHERE tenant = 'default' AND method = 'POST' AND route = '/v1/signup' AND idem_key = 'min-' || :n || '-' || :m
   AND fence = md5('fence' || :n || '-' || :m)::uuid AND state = 'in_progress';
COMMIT;
