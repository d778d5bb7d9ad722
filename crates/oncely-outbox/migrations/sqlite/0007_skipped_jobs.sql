-- A job its handler chose not to run (a decoy with nobody to send to, an email over a cap) ends
-- 'skipped', not 'dead': dead lists only real failures, the ones an operator re-drives.
-- skipped_at (Unix milliseconds): when it was skipped (sent_at and dead_at stay for their own
-- statuses). The jobs an earlier release made dead for a skip (their last attempt 'skipped')
-- become skipped. The prune index covers every finished job by when it finished, skipped ones
-- included.
--
-- SQLite cannot alter a CHECK: the jobs table is rebuilt. The attempts table references it
-- (ON DELETE CASCADE), so it is set aside first and rebuilt after: dropping the jobs table while
-- attempts reference it would delete them. Every index is made again (the unique operation
-- key with the table).
CREATE TABLE oncely_outbox_attempts_kept AS SELECT * FROM oncely_outbox_attempts;
DROP TABLE oncely_outbox_attempts;
CREATE TABLE oncely_outbox_new (
    id                  INTEGER PRIMARY KEY,
    operation_key       TEXT    NOT NULL UNIQUE,
    kind                TEXT    NOT NULL,
    payload             TEXT    NOT NULL,
    delivery_key        BLOB    NOT NULL,
    status              TEXT    NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'sent', 'dead', 'skipped')),
    attempts            INTEGER NOT NULL DEFAULT 0,
    run_after           INTEGER NOT NULL,
    lease_token         BLOB,
    not_after           INTEGER,
    created_at          INTEGER NOT NULL,
    sent_at             INTEGER,
    dead_at             INTEGER,
    last_error          TEXT,
    provider_message_id TEXT,
    free_attempts       INTEGER NOT NULL DEFAULT 0,
    redriven_at         INTEGER,
    frozen              TEXT,
    skipped_at          INTEGER
);
INSERT INTO oncely_outbox_new
       (id, operation_key, kind, payload, delivery_key, status, attempts, run_after, lease_token,
        not_after, created_at, sent_at, dead_at, last_error, provider_message_id, free_attempts,
        redriven_at, frozen, skipped_at)
SELECT o.id, o.operation_key, o.kind, o.payload, o.delivery_key,
       CASE WHEN o.status = 'dead' AND last.result = 'skipped' THEN 'skipped' ELSE o.status END,
       o.attempts, o.run_after, o.lease_token, o.not_after, o.created_at, o.sent_at,
       CASE WHEN o.status = 'dead' AND last.result = 'skipped' THEN NULL ELSE o.dead_at END,
       o.last_error, o.provider_message_id, o.free_attempts, o.redriven_at, o.frozen,
       CASE WHEN o.status = 'dead' AND last.result = 'skipped' THEN o.dead_at END
  FROM oncely_outbox o
  LEFT JOIN oncely_outbox_attempts_kept last
    ON last.id = (SELECT max(a.id) FROM oncely_outbox_attempts_kept a WHERE a.job_id = o.id);
DROP TABLE oncely_outbox;
ALTER TABLE oncely_outbox_new RENAME TO oncely_outbox;
CREATE TABLE oncely_outbox_attempts (
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
INSERT INTO oncely_outbox_attempts
       (id, job_id, attempt, worker, lease_token, started_at, finished_at, result,
        provider_message_id, error)
SELECT id, job_id, attempt, worker, lease_token, started_at, finished_at, result,
       provider_message_id, error
  FROM oncely_outbox_attempts_kept;
DROP TABLE oncely_outbox_attempts_kept;
CREATE INDEX oncely_outbox_attempts_job ON oncely_outbox_attempts (job_id, attempt);
CREATE INDEX oncely_outbox_due_by_kind ON oncely_outbox (kind, run_after, id) WHERE status = 'pending';
CREATE INDEX oncely_outbox_finished ON oncely_outbox (COALESCE(sent_at, dead_at, skipped_at)) WHERE status <> 'pending';
