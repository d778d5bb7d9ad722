-- The outbox on SQLite; times are Unix milliseconds. Same queries and indexes as PostgreSQL
-- (claims run in BEGIN IMMEDIATE instead of SKIP LOCKED: SQLite has one writer).
CREATE TABLE oncely_outbox (
    id                  INTEGER PRIMARY KEY,
    operation_key       TEXT    NOT NULL UNIQUE,
    kind                TEXT    NOT NULL,
    payload             TEXT    NOT NULL,
    delivery_key        BLOB    NOT NULL,
    status              TEXT    NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'sent', 'dead')),
    attempts            INTEGER NOT NULL DEFAULT 0,
    run_after           INTEGER NOT NULL,
    lease_token         BLOB,
    not_after           INTEGER,
    created_at          INTEGER NOT NULL,
    sent_at             INTEGER,
    dead_at             INTEGER,
    last_error          TEXT,
    provider_message_id TEXT
);

CREATE INDEX oncely_outbox_due ON oncely_outbox (run_after, id) WHERE status = 'pending';

CREATE TABLE oncely_outbox_attempts (
    id                  INTEGER PRIMARY KEY,
    job_id              INTEGER NOT NULL REFERENCES oncely_outbox (id) ON DELETE CASCADE,
    attempt             INTEGER NOT NULL,
    worker              TEXT    NOT NULL,
    lease_token         BLOB    NOT NULL,
    started_at          INTEGER NOT NULL,
    finished_at         INTEGER,
    result              TEXT CHECK (result IN ('sent', 'retry', 'unknown', 'dead', 'expired', 'abandoned', 'released')),
    provider_message_id TEXT,
    error               TEXT
);

CREATE INDEX oncely_outbox_attempts_job ON oncely_outbox_attempts (job_id, attempt);
