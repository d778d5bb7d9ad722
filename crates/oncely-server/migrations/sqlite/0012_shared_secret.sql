-- See the PostgreSQL migration of the same name.
INSERT INTO oncely_shared_secret_check (id, current_mac, previous_mac, retired_macs)
SELECT id, current_mac, previous_mac, retired_macs FROM oncely_secret_check
WHERE true
ON CONFLICT (id) DO NOTHING;

INSERT INTO oncely_shared_development_secret (id, secret)
SELECT id, secret FROM oncely_development_secret
WHERE true
ON CONFLICT (id) DO NOTHING;
