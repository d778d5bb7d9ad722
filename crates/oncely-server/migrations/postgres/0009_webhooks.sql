-- Webhook endpoints (Standard Webhooks), and how a tenant's emails are delivered.
--
-- oncely_webhook_endpoints: where a tenant's events go (`oncely tenant webhook add`). `events`
-- is a JSON array of event types (`["user.verified"]`; `[]`: every event). The signing secret
-- is stored sealed with the server secret (never in clear): `secret_sealed`, and during a
-- rotation's grace period the previous one, `previous_secret_sealed` until
-- `previous_secret_expires_at`. A disabled endpoint (`disabled_at`; by an operator, or because
-- it answered 410 Gone) gets no new events, and its pending deliveries end. No foreign key to
-- oncely_tenants: the default tenant has no row there and may have endpoints too.
-- Read by (tenant) at every event, in the state change's transaction: the index
-- oncely_webhook_endpoints_tenant.
--
-- oncely_tenants.email_delivery: `mail` (oncely sends the emails) or `webhook` (oncely delivers
-- each email as an `email.requested` event; the application sends it).
-- Only adds: a process of the previous release still runs beside this one.
CREATE TABLE oncely_webhook_endpoints (
    id                         uuid        PRIMARY KEY,
    tenant                     text        NOT NULL,
    url                        text        NOT NULL,
    events                     text        NOT NULL DEFAULT '[]',
    secret_sealed              text        NOT NULL,
    previous_secret_sealed     text,
    previous_secret_expires_at timestamptz,
    created_at                 timestamptz NOT NULL DEFAULT now(),
    disabled_at                timestamptz,
    disabled_reason            text
);
CREATE INDEX oncely_webhook_endpoints_tenant ON oncely_webhook_endpoints (tenant, created_at, id);

ALTER TABLE oncely_tenants ADD COLUMN email_delivery text NOT NULL DEFAULT 'mail'
    CHECK (email_delivery IN ('mail', 'webhook'));
