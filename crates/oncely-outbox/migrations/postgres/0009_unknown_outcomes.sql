-- Parked jobs: under a kind whose unknown-outcome policy is `reconcile` (KindOptions::on_unknown),
-- a job whose attempt may or may not have reached the provider (an unknown outcome, an attempt
-- its worker abandoned) is not sent again blindly: it parks in status 'unknown', its attempts
-- kept, until a reconciler or an operator settles it — 'sent', or 'pending' again to be resent
-- under the same delivery key. parked_at: since when (its age in metrics). A parked job is in no
-- due index, so it never keeps other jobs waiting; run_after is when a reconciler looks at it
-- next, and this index serves that look and the operators' list. Only widens the status check
-- and adds a nullable column and an index: a previous release still runs on a migrated database
-- (it never parks a job, and leaves parked ones alone: it claims, finishes and prunes only
-- pending or finished jobs). An attempt that a claim did not run because the attempt before it
-- was abandoned ends 'parked'. Every check is NOT VALID, so that a large history is not scanned
-- under the table's lock: the two widened ones pass every existing row already, and the new
-- column is NULL in every existing row.
ALTER TABLE oncely_outbox DROP CONSTRAINT oncely_outbox_status_check;
ALTER TABLE oncely_outbox ADD COLUMN parked_at timestamptz;
-- settled: 'sent' when a parked job was settled as sent; the next claim records it sent without
-- running its handler (and names its follow-ups), then clears it.
ALTER TABLE oncely_outbox ADD COLUMN settled text;
ALTER TABLE oncely_outbox ADD CONSTRAINT oncely_outbox_settled_check
    CHECK (settled IN ('sent')) NOT VALID;
ALTER TABLE oncely_outbox ADD CONSTRAINT oncely_outbox_status_check
    CHECK (status IN ('pending', 'sent', 'dead', 'skipped', 'unknown')) NOT VALID;
CREATE INDEX oncely_outbox_parked ON oncely_outbox (run_after, id) WHERE status = 'unknown';
ALTER TABLE oncely_outbox_attempts DROP CONSTRAINT oncely_outbox_attempts_result_check;
ALTER TABLE oncely_outbox_attempts ADD CONSTRAINT oncely_outbox_attempts_result_check
    CHECK (result IN ('sent', 'retry', 'unknown', 'dead', 'expired', 'abandoned', 'released', 'skipped',
                      'throttled', 'paused', 'parked')) NOT VALID;
