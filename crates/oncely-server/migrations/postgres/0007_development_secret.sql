-- The server secret a development database made for itself (no ONCELY_SECRET given): every
-- `serve` and `worker` of the database signs with it, wherever it was started. Production
-- never reads it: ONCELY_SECRET is required there.
CREATE TABLE oncely_development_secret (
    id integer PRIMARY KEY CHECK (id = 1),
    secret text NOT NULL
);
