-- The secret check and the development secret moved to the key store's history
-- (`oncely_shared_secret_check`, `oncely_shared_development_secret`, its migration 0002, which
-- runs before this one), so that the gateway needs no account table. This copies the rows of
-- the old tables, unless the new ones already hold some. The old tables stay: processes of the
-- previous release read them during a rolling upgrade.
INSERT INTO oncely_shared_secret_check (id, current_mac, previous_mac, retired_macs)
SELECT id, current_mac, previous_mac, retired_macs FROM oncely_secret_check
ON CONFLICT (id) DO NOTHING;

INSERT INTO oncely_shared_development_secret (id, secret)
SELECT id, secret FROM oncely_development_secret
ON CONFLICT (id) DO NOTHING;
