-- Throttled and paused attempts spend no attempt of the budget: free_attempts counts them (the
-- policy compares attempts - free_attempts with its maximum), so attempt numbers stay unique.
-- redriven_at (Unix milliseconds): when an operator last re-drove the job; its retry horizon
-- counts from there.
ALTER TABLE oncely_outbox ADD COLUMN free_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE oncely_outbox ADD COLUMN redriven_at INTEGER;
-- Adds the attempt results 'throttled' and 'paused' (SQLite cannot alter a CHECK: rebuild the
-- table, as 0002 did; nothing references it).
CREATE TABLE oncely_outbox_attempts_new (
    id                  INTEGER PRIMARY KEY,
    job_id              INTEGER NOT NULL REFERENCES oncely_outbox (id) ON DELETE CASCADE,
    attempt             INTEGER NOT NULL,
    worker              TEXT    NOT NULL,
    lease_token         BLOB    NOT NULL,
    started_at          INTEGER NOT NULL,
    finished_at         INTEGER,
    result              TEXT CHECK (result IN ('sent', 'retry', 'unknown', 'dead', 'expired', 'abandoned', 'released', 'skipped',
                                               'throttled', 'paused')),
    provider_message_id TEXT,
    error               TEXT
);
INSERT INTO oncely_outbox_attempts_new SELECT * FROM oncely_outbox_attempts;
DROP TABLE oncely_outbox_attempts;
ALTER TABLE oncely_outbox_attempts_new RENAME TO oncely_outbox_attempts;
CREATE INDEX oncely_outbox_attempts_job ON oncely_outbox_attempts (job_id, attempt);
