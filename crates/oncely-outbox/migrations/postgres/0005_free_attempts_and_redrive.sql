-- Throttled and paused attempts spend no attempt of the budget: free_attempts counts them (the
-- policy compares attempts - free_attempts with its maximum), so attempt numbers stay unique.
-- redriven_at: when an operator last re-drove the job; its retry horizon counts from there.
-- Their attempt results: 'throttled' and 'paused'.
ALTER TABLE oncely_outbox ADD COLUMN free_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE oncely_outbox ADD COLUMN redriven_at timestamptz;
-- NOT VALID: the rows already there met the narrower check, so the attempts table is not
-- scanned (under the lock this migration holds) to prove it again.
ALTER TABLE oncely_outbox_attempts DROP CONSTRAINT oncely_outbox_attempts_result_check;
ALTER TABLE oncely_outbox_attempts ADD CONSTRAINT oncely_outbox_attempts_result_check
    CHECK (result IN ('sent', 'retry', 'unknown', 'dead', 'expired', 'abandoned', 'released', 'skipped',
                      'throttled', 'paused')) NOT VALID;
