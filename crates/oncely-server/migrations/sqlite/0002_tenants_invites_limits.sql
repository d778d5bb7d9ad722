-- See the PostgreSQL migration of the same name. SQLite cannot drop NOT NULL: rebuild tokens.
CREATE TABLE oncely_tenants (
    id           TEXT    PRIMARY KEY,
    api_key_hash BLOB    NOT NULL UNIQUE,
    created_at   INTEGER NOT NULL
);

CREATE TABLE oncely_memberships (
    tenant     TEXT    NOT NULL,
    user_id    BLOB    NOT NULL REFERENCES oncely_users (id) ON DELETE CASCADE,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, user_id)
);

CREATE TABLE oncely_rate_limits (
    tenant       TEXT    NOT NULL,
    bucket       TEXT    NOT NULL,
    window_start INTEGER NOT NULL,
    count        INTEGER NOT NULL,
    PRIMARY KEY (tenant, bucket, window_start)
);

CREATE TABLE oncely_tokens_new (
    id            BLOB    PRIMARY KEY,
    tenant        TEXT    NOT NULL,
    user_id       BLOB    REFERENCES oncely_users (id) ON DELETE CASCADE,
    flow          TEXT    NOT NULL,
    token_hash    BLOB    NOT NULL UNIQUE,
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    consumed_at   INTEGER,
    superseded_at INTEGER,
    email         TEXT
);
INSERT INTO oncely_tokens_new (id, tenant, user_id, flow, token_hash, created_at, expires_at, consumed_at, superseded_at)
    SELECT id, tenant, user_id, flow, token_hash, created_at, expires_at, consumed_at, superseded_at FROM oncely_tokens;
DROP TABLE oncely_tokens;
ALTER TABLE oncely_tokens_new RENAME TO oncely_tokens;
CREATE INDEX oncely_tokens_live ON oncely_tokens (user_id, flow)
    WHERE consumed_at IS NULL AND superseded_at IS NULL;
