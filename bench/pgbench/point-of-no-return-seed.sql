-- Seeds bench/pgbench/point-of-no-return.sql on a database the outbox's migrations ran on
-- (`oncely migrate`), empty: 10,000 claimed jobs with their open attempts.
INSERT INTO oncely_outbox (operation_key, kind, payload, delivery_key, run_after, created_at,
                           lease_token, attempts)
SELECT 'pnr:' || g, 'email.verification', '{}', gen_random_uuid(), now(), now(),
       '00000000-0000-0000-0000-000000000001', 1
  FROM generate_series(1, 10000) g;
INSERT INTO oncely_outbox_attempts (job_id, attempt, worker, lease_token, started_at,
                                    point_of_no_return)
SELECT id, 1, 'bench', lease_token, now(), 'ahead' FROM oncely_outbox;
ANALYZE oncely_outbox;
ANALYZE oncely_outbox_attempts;
