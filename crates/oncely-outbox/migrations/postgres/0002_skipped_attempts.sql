-- A job the handler decided not to run (no recipient, rate-limited) ends 'dead' with an attempt
-- whose result is 'skipped' and whose error says why.
ALTER TABLE oncely_outbox_attempts DROP CONSTRAINT oncely_outbox_attempts_result_check;
ALTER TABLE oncely_outbox_attempts ADD CONSTRAINT oncely_outbox_attempts_result_check
    CHECK (result IN ('sent', 'retry', 'unknown', 'dead', 'expired', 'abandoned', 'released', 'skipped'));
