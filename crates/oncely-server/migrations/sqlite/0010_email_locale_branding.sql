-- Emails a team can ship: the language of each account's and each link's emails, and each
-- tenant's branding.
--
-- oncely_users.locale: the BCP 47 tag the account's emails are written in: its signup's or
-- invitation's (`locale`, else Accept-Language), confirmed by the link the address owner used
-- to verify; NULL: English.
-- oncely_tokens.locale: the locale a link's email was asked in; NULL: the account's.
-- oncely_tenants.product_name, mail_from, support_email: `oncely tenant set --product-name
-- --mail-from --support-email`; NULL: the service's (ONCELY_PRODUCT_NAME, ONCELY_MAIL_FROM,
-- ONCELY_SUPPORT_EMAIL).
-- Only adds: a process of the previous release still runs beside this one.
ALTER TABLE oncely_users ADD COLUMN locale TEXT;
ALTER TABLE oncely_tokens ADD COLUMN locale TEXT;
ALTER TABLE oncely_tenants ADD COLUMN product_name TEXT;
ALTER TABLE oncely_tenants ADD COLUMN mail_from TEXT;
ALTER TABLE oncely_tenants ADD COLUMN support_email TEXT;
