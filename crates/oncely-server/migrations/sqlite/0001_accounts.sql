-- Accounts on SQLite (times: Unix milliseconds). Same queries and indexes as PostgreSQL.
CREATE TABLE oncely_users (
    id            BLOB    PRIMARY KEY,
    tenant        TEXT    NOT NULL,
    email         TEXT    NOT NULL,
    password_hash TEXT,
    source        TEXT,
    status        TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'verified')),
    created_at    INTEGER NOT NULL,
    verified_at   INTEGER,
    UNIQUE (tenant, email)
);

CREATE TABLE oncely_tokens (
    id            BLOB    PRIMARY KEY,
    tenant        TEXT    NOT NULL,
    user_id       BLOB    NOT NULL REFERENCES oncely_users (id) ON DELETE CASCADE,
    flow          TEXT    NOT NULL,
    token_hash    BLOB    NOT NULL UNIQUE,
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    consumed_at   INTEGER,
    superseded_at INTEGER
);

CREATE INDEX oncely_tokens_live ON oncely_tokens (user_id, flow)
    WHERE consumed_at IS NULL AND superseded_at IS NULL;
