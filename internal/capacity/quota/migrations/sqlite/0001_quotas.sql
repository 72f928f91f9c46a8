-- Quotas: what a tenant, or one of its projects, may hold — GPUs at once and
-- GPU-hours booked in all — optionally narrowed to one GPU model or one pool.
-- An empty project_id, model or pool_id means "all"; -1 means unlimited. One
-- row per scope: Set replaces it. Usage is not stored here: it is computed
-- from reservations when a booking is checked or a quota is read.
CREATE TABLE quotas (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    project_id  TEXT NOT NULL DEFAULT '',
    model       TEXT NOT NULL DEFAULT '',
    pool_id     TEXT NOT NULL DEFAULT '',
    gpus        INTEGER NOT NULL DEFAULT -1 CHECK (gpus >= -1),
    gpu_hours   REAL NOT NULL DEFAULT -1 CHECK (gpu_hours = -1 OR gpu_hours >= 0),
    created_by  TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    update_time TIMESTAMP NOT NULL,
    -- Also the index of the covering-quota lookup every booking makes.
    UNIQUE (tenant_id, project_id, model, pool_id)
);
CREATE INDEX quotas_tenant ON quotas (tenant_id, id);
