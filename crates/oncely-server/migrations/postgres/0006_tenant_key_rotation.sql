-- A tenant's API key can be replaced (`oncely tenant rotate-key`): the replaced key's hash is
-- kept, and keeps working, until previous_key_expires_at (a grace period; without one both are
-- NULL and the old key stops at once). One previous key at a time. Lookups by a key read
-- api_key_hash (its unique index) or previous_key_hash (the partial unique index below).
-- Only adds nullable columns: a process of the previous release still runs beside this one
-- (it knows only the current key).
ALTER TABLE oncely_tenants ADD COLUMN previous_key_hash bytea;
ALTER TABLE oncely_tenants ADD COLUMN previous_key_expires_at timestamptz;
CREATE UNIQUE INDEX oncely_tenants_previous_key ON oncely_tenants (previous_key_hash)
    WHERE previous_key_hash IS NOT NULL;
