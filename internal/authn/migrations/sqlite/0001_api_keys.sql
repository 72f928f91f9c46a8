CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('platform-admin', 'admin', 'member', 'viewer', 'agent')),
    kind        TEXT NOT NULL CHECK (kind IN ('user', 'service', 'agent')),
    prefix      TEXT NOT NULL,
    secret_hash TEXT NOT NULL UNIQUE,
    created_by  TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    expire_time TIMESTAMP,
    revoke_time TIMESTAMP
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, id);
-- One bootstrap key per platform, even when replicas start together.
CREATE UNIQUE INDEX api_keys_one_bootstrap ON api_keys (created_by) WHERE created_by = 'bootstrap';
