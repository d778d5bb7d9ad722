-- Parked jobs: under a kind whose unknown-outcome policy is `reconcile` (KindOptions::on_unknown),
-- a job whose attempt may or may not have reached the provider (an unknown outcome, an attempt
-- its worker abandoned) is not sent again blindly: it parks in status 'unknown', its attempts
-- kept, until a reconciler or an operator settles it — 'sent', or 'pending' again to be resent
-- under the same delivery key. parked_at (Unix milliseconds): since when. A parked job is in no
-- due index, so it never keeps other jobs waiting; run_after is when a reconciler looks at it
-- next, and oncely_outbox_parked serves that look and the operators' list. settled: 'sent' when
-- a parked job was settled as sent; the next claim records it sent without running its handler
-- (and names its follow-ups), then clears it. An attempt that a
-- claim did not run because the attempt before it was abandoned ends 'parked'.
--
-- SQLite cannot alter a CHECK: the jobs table is rebuilt, as in 0007 (the attempts table,
-- which references it, is set aside first and rebuilt after; every index is made again).
CREATE TABLE oncely_outbox_attempts_kept AS SELECT * FROM oncely_outbox_attempts;
DROP TABLE oncely_outbox_attempts;
CREATE TABLE oncely_outbox_new (
    id                  INTEGER PRIMARY KEY,
    operation_key       TEXT    NOT NULL UNIQUE,
    kind                TEXT    NOT NULL,
    payload             TEXT    NOT NULL,
    delivery_key        BLOB    NOT NULL,
    status              TEXT    NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'sent', 'dead', 'skipped', 'unknown')),
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
    skipped_at          INTEGER,
    partition_key       TEXT,
    parked_at           INTEGER,
    settled             TEXT CHECK (settled IN ('sent'))
);
INSERT INTO oncely_outbox_new
       (id, operation_key, kind, payload, delivery_key, status, attempts, run_after, lease_token,
        not_after, created_at, sent_at, dead_at, last_error, provider_message_id, free_attempts,
        redriven_at, frozen, skipped_at, partition_key)
SELECT id, operation_key, kind, payload, delivery_key, status, attempts, run_after, lease_token,
       not_after, created_at, sent_at, dead_at, last_error, provider_message_id, free_attempts,
       redriven_at, frozen, skipped_at, partition_key
  FROM oncely_outbox;
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
                                               'throttled', 'paused', 'parked')),
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
CREATE INDEX oncely_outbox_due_by_partition ON oncely_outbox (kind, partition_key, run_after, id)
    WHERE status = 'pending';
CREATE INDEX oncely_outbox_parked ON oncely_outbox (run_after, id) WHERE status = 'unknown';
