-- Re-entering a signup's password at verification is limited per link: every attempt counts,
-- committed on its own (a wrong guess rolls the request back, not the count).
ALTER TABLE oncely_tokens ADD COLUMN password_attempts integer NOT NULL DEFAULT 0;
