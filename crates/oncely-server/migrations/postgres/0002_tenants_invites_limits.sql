-- Tenants (API keys stored as SHA-256 only), invite memberships, email rate limits, and tokens
-- that belong to an address rather than a user (invites) or to nobody (the decoy written for an
-- unknown address, so that both cases do the same database work; never consumable).
CREATE TABLE oncely_tenants (
    id           text        PRIMARY KEY,
    api_key_hash bytea       NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE oncely_memberships (
    tenant     text        NOT NULL,
    user_id    uuid        NOT NULL REFERENCES oncely_users (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, user_id)
);

-- One row per (tenant, bucket, fixed window); bucket is a keyed hash of the normalized address
-- or the client address. Upserted with count + 1 (primary key).
CREATE TABLE oncely_rate_limits (
    tenant       text    NOT NULL,
    bucket       text    NOT NULL,
    window_start bigint  NOT NULL,
    count        integer NOT NULL,
    PRIMARY KEY (tenant, bucket, window_start)
);

ALTER TABLE oncely_tokens ALTER COLUMN user_id DROP NOT NULL;
ALTER TABLE oncely_tokens ADD COLUMN email text;
