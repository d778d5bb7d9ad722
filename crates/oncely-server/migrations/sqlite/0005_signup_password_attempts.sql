-- See the PostgreSQL migration of the same name.
ALTER TABLE oncely_tokens ADD COLUMN password_attempts INTEGER NOT NULL DEFAULT 0;
