-- A password chosen at signup belongs to that signup's verification token, never to the
-- account until the address owner verifies with that token *and* re-enters the password.
-- Before this migration a pending account held the password of whoever signed up (possibly
-- an attacker pre-registering a victim's address): it moves to the account's live
-- verification tokens, and pending accounts keep no password.
ALTER TABLE oncely_tokens ADD COLUMN password_hash text;

UPDATE oncely_tokens t SET password_hash = u.password_hash
  FROM oncely_users u
 WHERE t.user_id = u.id AND u.status = 'pending' AND u.password_hash IS NOT NULL
   AND t.flow = 'verification' AND t.consumed_at IS NULL AND t.superseded_at IS NULL;

UPDATE oncely_users SET password_hash = NULL WHERE status = 'pending';
