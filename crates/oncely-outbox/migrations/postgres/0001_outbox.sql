-- The outbox: one row per business intent (operation_key), delivered by workers.
-- Queries and the index each one uses:
--   enqueue: the unique index on operation_key (ON CONFLICT DO NOTHING);
--   claim: oncely_outbox_due, a partial index of pending rows only, so claims stay fast however
--          many sent and dead rows are kept (ORDER BY run_after, id LIMIT n FOR UPDATE SKIP LOCKED);
--   finish, release: the primary key, guarded by lease_token;
--   attempts of a job: oncely_outbox_attempts_job.
-- A claimed row's run_after is pushed to the end of its lease: if the worker dies, the row is due
-- again when the lease ends, with no extra column or index.
CREATE TABLE oncely_outbox (
    id                  bigserial   PRIMARY KEY,
    operation_key       text        NOT NULL UNIQUE,
    kind                text        NOT NULL,
    payload             jsonb       NOT NULL,
    delivery_key        uuid        NOT NULL,
    status              text        NOT NULL DEFAULT 'pending'
                                    CHECK (status IN ('pending', 'sent', 'dead')),
    attempts            integer     NOT NULL DEFAULT 0,
    run_after           timestamptz NOT NULL DEFAULT now(),
    lease_token         uuid,
    not_after           timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    sent_at             timestamptz,
    dead_at             timestamptz,
    last_error          text,
    provider_message_id text
);

CREATE INDEX oncely_outbox_due ON oncely_outbox (run_after, id) WHERE status = 'pending';

CREATE TABLE oncely_outbox_attempts (
    id                  bigserial   PRIMARY KEY,
    job_id              bigint      NOT NULL REFERENCES oncely_outbox (id) ON DELETE CASCADE,
    attempt             integer     NOT NULL,
    worker              text        NOT NULL,
    lease_token         uuid        NOT NULL,
    started_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    result              text CHECK (result IN ('sent', 'retry', 'unknown', 'dead', 'expired', 'abandoned', 'released')),
    provider_message_id text,
    error               text
);

CREATE INDEX oncely_outbox_attempts_job ON oncely_outbox_attempts (job_id, attempt);
