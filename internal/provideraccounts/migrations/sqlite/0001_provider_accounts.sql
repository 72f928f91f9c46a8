-- Provider accounts: a tenant's account at a service that rents it servers.
-- settings and secret_refs are JSON objects; a credential is only ever a
-- secret://<name> reference to the tenant's sealed secrets.
CREATE TABLE provider_accounts (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    type        TEXT NOT NULL,
    settings    TEXT NOT NULL DEFAULT '{}',
    secret_refs TEXT NOT NULL DEFAULT '{}',
    endpoint    TEXT NOT NULL DEFAULT '',
    created_by  TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX provider_accounts_tenant ON provider_accounts (tenant_id, id);
