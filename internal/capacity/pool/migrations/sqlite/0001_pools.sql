-- Pools: a tenant's named node sets. The selector (a JSON array of
-- matchExpressions) and the policy (a JSON object) are validated by the API
-- and stored as text; archived pools keep their row and their name.
CREATE TABLE pools (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    name         TEXT NOT NULL,
    selector     TEXT NOT NULL DEFAULT '[]',
    policy       TEXT NOT NULL DEFAULT '{}',
    state        TEXT NOT NULL CHECK (state IN ('active', 'archived')),
    created_by   TEXT NOT NULL,
    create_time  TIMESTAMP NOT NULL,
    update_time  TIMESTAMP NOT NULL,
    archive_time TIMESTAMP,
    UNIQUE (tenant_id, name)
);
CREATE INDEX pools_tenant ON pools (tenant_id, id);
