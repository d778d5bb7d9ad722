-- Return URLs and one-time codes (`POST /v1/exchange`).
--
-- oncely_return_urls: where a tenant's links may send the browser back, in order (`oncely
-- tenant set --return-url`); the first is the default. A flow request's `return_to` must equal
-- one of them byte for byte. Read by (tenant), its primary key's prefix.
--
-- oncely_tokens.return_to: the URL a link's flow returns to, chosen at the request; NULL: none
-- (the flow answers as before, no code).
--
-- oncely_codes: a code minted when a link with a return URL is used. Only SHA-256 of the code
-- is stored; it is bound to the tenant, the flow and the user, lives 60 s and is used once.
-- The exchange finds it by code_hash (primary key); pruning reads oncely_codes_expires_at.
-- Only adds: a process of the previous release still runs beside this one.
CREATE TABLE oncely_return_urls (
    tenant   text    NOT NULL REFERENCES oncely_tenants (id) ON DELETE CASCADE,
    position bigint  NOT NULL,
    url      text    NOT NULL,
    PRIMARY KEY (tenant, position)
);

ALTER TABLE oncely_tokens ADD COLUMN return_to text;

CREATE TABLE oncely_codes (
    code_hash        bytea       PRIMARY KEY,
    tenant           text        NOT NULL,
    user_id          uuid        NOT NULL REFERENCES oncely_users (id) ON DELETE CASCADE,
    flow             text        NOT NULL,
    authenticated_at timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    consumed_at      timestamptz
);
CREATE INDEX oncely_codes_expires_at ON oncely_codes (expires_at);
