-- See the PostgreSQL migration of the same name. SQLite has no conditional statements: the rows
-- of the account service's old tables are copied by its migration 0012 (`serve`, `worker` and
-- `oncely migrate` run it after this one).
CREATE TABLE oncely_shared_secret_check (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    current_mac TEXT NOT NULL,
    previous_mac TEXT,
    retired_macs TEXT NOT NULL DEFAULT ''
);

CREATE TABLE oncely_shared_development_secret (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    secret TEXT NOT NULL
);
