-- See the PostgreSQL migration of the same name.
ALTER TABLE oncely_tokens ADD COLUMN password_hash TEXT;

UPDATE oncely_tokens SET password_hash = (
    SELECT u.password_hash FROM oncely_users u WHERE u.id = oncely_tokens.user_id AND u.status = 'pending')
 WHERE flow = 'verification' AND consumed_at IS NULL AND superseded_at IS NULL
   AND user_id IN (SELECT id FROM oncely_users WHERE status = 'pending' AND password_hash IS NOT NULL);

UPDATE oncely_users SET password_hash = NULL WHERE status = 'pending';
