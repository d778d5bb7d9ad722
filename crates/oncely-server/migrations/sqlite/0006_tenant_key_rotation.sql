-- See the PostgreSQL migration of the same name. Times are Unix milliseconds.
ALTER TABLE oncely_tenants ADD COLUMN previous_key_hash BLOB;
ALTER TABLE oncely_tenants ADD COLUMN previous_key_expires_at INTEGER;
CREATE UNIQUE INDEX oncely_tenants_previous_key ON oncely_tenants (previous_key_hash)
    WHERE previous_key_hash IS NOT NULL;
