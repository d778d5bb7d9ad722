-- What every process on this database must share: the server secret (it makes fingerprints,
-- scopes hashed from credentials, links). Two tables, both one row:
--
-- `oncely_shared_secret_check`: keyed hashes (HMAC-SHA256 of a fixed text, hex) of the secret
-- the processes use, and of the previous one during a rotation. A process started with another
-- secret is refused, rather than answering 422 to its neighbours' retries or, where keys are
-- scoped by a credential hashed with the secret (`oncely gateway`), running them again.
-- `retired_macs`: the secrets of rotations that ended (comma-separated), never accepted again.
-- Never the secret.
--
-- `oncely_shared_development_secret`: the secret a development database made for itself (no
-- ONCELY_SECRET given), so every process of it signs alike, wherever it was started.
-- Production never reads it: ONCELY_SECRET is required there.
--
-- Until this migration the account service kept both (`oncely_secret_check`,
-- `oncely_development_secret`); the gateway, which has no account tables, needs them here.
-- Their rows are copied when those tables exist (the account service's migration 0012 copies
-- them too, for databases where it runs after this one); the old tables stay for processes of
-- the previous release during a rolling upgrade.
CREATE TABLE oncely_shared_secret_check (
    id integer PRIMARY KEY CHECK (id = 1),
    current_mac text NOT NULL,
    previous_mac text,
    retired_macs text NOT NULL DEFAULT ''
);

CREATE TABLE oncely_shared_development_secret (
    id integer PRIMARY KEY CHECK (id = 1),
    secret text NOT NULL
);

DO $$
BEGIN
    IF to_regclass('oncely_secret_check') IS NOT NULL THEN
        INSERT INTO oncely_shared_secret_check (id, current_mac, previous_mac, retired_macs)
        SELECT id, current_mac, previous_mac, retired_macs FROM oncely_secret_check
        ON CONFLICT (id) DO NOTHING;
    END IF;
    IF to_regclass('oncely_development_secret') IS NOT NULL THEN
        INSERT INTO oncely_shared_development_secret (id, secret)
        SELECT id, secret FROM oncely_development_secret
        ON CONFLICT (id) DO NOTHING;
    END IF;
END
$$;
