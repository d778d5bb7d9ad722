-- The point of no return's write (issue 36): Statements::PASS on PostgreSQL, what a worker runs
-- once per email of a reconciling kind, just before the message's data leaves. Seeded by
-- bench/pgbench/point-of-no-return-seed.sql: 10,000 claimed jobs (ids 1–10,000, lease token
-- ...0001), each with its open attempt. Each run sets 'passed' again on a random one (a new
-- row version, as the first write makes).
--   psql "$DB" -f bench/pgbench/point-of-no-return-seed.sql
--   pgbench -n -M prepared -f bench/pgbench/point-of-no-return.sql -c 1 -T 10 "$DB"
\set id random(1, 10000)
UPDATE oncely_outbox_attempts a
   SET point_of_no_return = 'passed', handed_over_at = COALESCE(a.handed_over_at, now())
 WHERE a.job_id = :id AND a.lease_token = '00000000-0000-0000-0000-000000000001'
   AND a.finished_at IS NULL
   AND EXISTS (SELECT 1 FROM oncely_outbox o
                WHERE o.id = :id AND o.lease_token = '00000000-0000-0000-0000-000000000001'
                  AND o.status = 'pending')
RETURNING a.job_id;
