-- The operator role: a member who also drains nodes and acts on GPU health.
-- SQLite cannot change a CHECK in place: the table is rebuilt with the same
-- columns and indexes.
CREATE TABLE api_keys_new (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('platform-admin', 'admin', 'operator', 'member', 'viewer', 'agent')),
    kind        TEXT NOT NULL CHECK (kind IN ('user', 'service', 'agent')),
    prefix      TEXT NOT NULL,
    secret_hash TEXT NOT NULL UNIQUE,
    created_by  TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    expire_time TIMESTAMP,
    revoke_time TIMESTAMP
);
INSERT INTO api_keys_new (id, tenant_id, name, role, kind, prefix, secret_hash, created_by, create_time, expire_time, revoke_time)
SELECT id, tenant_id, name, role, kind, prefix, secret_hash, created_by, create_time, expire_time, revoke_time FROM api_keys;
DROP TABLE api_keys;
ALTER TABLE api_keys_new RENAME TO api_keys;
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, id);
CREATE UNIQUE INDEX api_keys_one_bootstrap ON api_keys (created_by) WHERE created_by = 'bootstrap';
