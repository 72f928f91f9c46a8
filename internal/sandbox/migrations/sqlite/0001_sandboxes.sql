-- Sandbox templates: checked once against a pool at create. env is a JSON
-- object of NAME -> secret://<name> (references, never values). shape
-- changes with every template (templates are not edited), so a warm
-- instance is claimed only by the template shape it was booted for. A
-- deleted template stays 'deleting' until its warm instances drain; only
-- an active one holds its name.
CREATE TABLE sandbox_templates (
    id             TEXT PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    name           TEXT NOT NULL,
    image          TEXT NOT NULL,
    flavor_id      TEXT NOT NULL,
    flavor_name    TEXT NOT NULL,
    pool_id        TEXT NOT NULL,
    ip_pool_id     TEXT NOT NULL,
    project_id     TEXT NOT NULL,
    default_ttl_s  BIGINT NOT NULL,
    max_ttl_s      BIGINT NOT NULL,
    warm_min       INTEGER NOT NULL,
    warm_max       INTEGER NOT NULL,
    env            TEXT NOT NULL,
    network_policy TEXT NOT NULL,
    shape          TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('active', 'deleting')),
    created_by     TEXT NOT NULL,
    create_time    TIMESTAMP NOT NULL,
    update_time    TIMESTAMP NOT NULL,
    CHECK (warm_min >= 0 AND warm_min <= warm_max),
    CHECK (default_ttl_s > 0 AND default_ttl_s <= max_ttl_s)
);
CREATE UNIQUE INDEX sandbox_templates_name ON sandbox_templates (tenant_id, name) WHERE state = 'active';

-- Warm instances: booted paused for a template shape, claimed by one
-- sandbox create (the row goes with the claim).
CREATE TABLE sandbox_warm (
    instance_id  TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    template_id  TEXT NOT NULL,
    shape        TEXT NOT NULL,
    create_time  TIMESTAMP NOT NULL
);
CREATE INDEX sandbox_warm_template ON sandbox_warm (template_id, shape, create_time);

-- Sandboxes: one instance each; expire_time is when the TTL sweep
-- deletes it. resumed is 1 once a claimed warm guest answered
-- instance.resume (a cold one is up when its instance runs).
CREATE TABLE sandboxes (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL,
    template_id   TEXT NOT NULL,
    template_name TEXT NOT NULL,
    instance_id   TEXT NOT NULL UNIQUE,
    state         TEXT NOT NULL CHECK (state IN ('active', 'deleted')),
    origin        TEXT NOT NULL CHECK (origin IN ('warm', 'cold')),
    resumed       INTEGER NOT NULL,
    created_by    TEXT NOT NULL,
    expire_time   TIMESTAMP NOT NULL,
    create_time   TIMESTAMP NOT NULL,
    update_time   TIMESTAMP NOT NULL
);
CREATE INDEX sandboxes_tenant ON sandboxes (tenant_id, id);
CREATE INDEX sandboxes_expiry ON sandboxes (state, expire_time);

-- Snapshots: tenant-private; they restore only on node_id.
CREATE TABLE sandbox_snapshots (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    sandbox_id   TEXT NOT NULL,
    template_id  TEXT NOT NULL,
    node_id      TEXT NOT NULL,
    shape        TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('saving', 'ready', 'failed')),
    create_time  TIMESTAMP NOT NULL
);
CREATE INDEX sandbox_snapshots_tenant ON sandbox_snapshots (tenant_id, id);
