-- See the PostgreSQL migration of the same name. Times are Unix milliseconds.
CREATE TABLE oncely_webhook_endpoints (
    id                         BLOB    PRIMARY KEY,
    tenant                     TEXT    NOT NULL,
    url                        TEXT    NOT NULL,
    events                     TEXT    NOT NULL DEFAULT '[]',
    secret_sealed              TEXT    NOT NULL,
    previous_secret_sealed     TEXT,
    previous_secret_expires_at INTEGER,
    created_at                 INTEGER NOT NULL,
    disabled_at                INTEGER,
    disabled_reason            TEXT
);
CREATE INDEX oncely_webhook_endpoints_tenant ON oncely_webhook_endpoints (tenant, created_at, id);

ALTER TABLE oncely_tenants ADD COLUMN email_delivery TEXT NOT NULL DEFAULT 'mail'
    CHECK (email_delivery IN ('mail', 'webhook'));
