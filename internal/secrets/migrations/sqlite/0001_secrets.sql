-- Secrets: a tenant's named values (tenant_id '' for the platform's own).
-- value is sealed (AES-256-GCM under the deployment secret, with the
-- secret's id as associated data); only the latest version is kept.
CREATE TABLE secrets (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    version     BIGINT NOT NULL CHECK (version > 0),
    value       BLOB NOT NULL,
    size_bytes  BIGINT NOT NULL CHECK (size_bytes >= 0),
    description TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    update_time TIMESTAMP NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX secrets_tenant ON secrets (tenant_id, id);
