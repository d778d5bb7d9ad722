-- See the PostgreSQL migration of the same name. Times are Unix milliseconds.
CREATE TABLE oncely_return_urls (
    tenant   TEXT    NOT NULL REFERENCES oncely_tenants (id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    url      TEXT    NOT NULL,
    PRIMARY KEY (tenant, position)
);

ALTER TABLE oncely_tokens ADD COLUMN return_to TEXT;

CREATE TABLE oncely_codes (
    code_hash        BLOB    PRIMARY KEY,
    tenant           TEXT    NOT NULL,
    user_id          BLOB    NOT NULL REFERENCES oncely_users (id) ON DELETE CASCADE,
    flow             TEXT    NOT NULL,
    authenticated_at INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    consumed_at      INTEGER
);
CREATE INDEX oncely_codes_expires_at ON oncely_codes (expires_at);
