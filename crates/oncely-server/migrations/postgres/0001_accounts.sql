-- Accounts. Queries and the index each one uses:
--   signup insert/lookup: oncely_users (tenant, email) unique — the uniqueness invariant;
--   token consume: oncely_tokens token_hash unique;
--   supersede a user's live tokens of a flow: oncely_tokens_live (partial).
CREATE TABLE oncely_users (
    id            uuid        PRIMARY KEY,
    tenant        text        NOT NULL,
    email         text        NOT NULL,
    password_hash text,
    source        text,
    status        text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'verified')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    verified_at   timestamptz,
    UNIQUE (tenant, email)
);

CREATE TABLE oncely_tokens (
    id            uuid        PRIMARY KEY,
    tenant        text        NOT NULL,
    user_id       uuid        NOT NULL REFERENCES oncely_users (id) ON DELETE CASCADE,
    flow          text        NOT NULL,
    token_hash    bytea       NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    consumed_at   timestamptz,
    superseded_at timestamptz
);

CREATE INDEX oncely_tokens_live ON oncely_tokens (user_id, flow)
    WHERE consumed_at IS NULL AND superseded_at IS NULL;
