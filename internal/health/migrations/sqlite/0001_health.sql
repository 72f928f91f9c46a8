-- Health findings: what bcd found wrong with a node or one of its GPUs.
-- An XID is an event row (open until a remediation or an operator closes
-- it); a standing finding (row remap, ECC, NVLink, ...) is one open row per
-- (node, gpu, kind, code), counted while bcd keeps reporting it and
-- resolved when a complete report no longer carries it.
CREATE TABLE health_findings (
    id             TEXT PRIMARY KEY,
    node_id        TEXT NOT NULL,
    tenant_id      TEXT NOT NULL,
    pool_id        TEXT NOT NULL DEFAULT '',
    gpu_uuid       TEXT NOT NULL DEFAULT '',
    gpu_index      INTEGER NOT NULL DEFAULT -1,
    kind           TEXT NOT NULL,
    code           BIGINT NOT NULL DEFAULT 0,
    severity       TEXT NOT NULL CHECK (severity IN ('critical', 'error', 'warning', 'info')),
    message        TEXT NOT NULL DEFAULT '',
    pid            BIGINT NOT NULL DEFAULT 0,
    process_name   TEXT NOT NULL DEFAULT '',
    action         TEXT NOT NULL CHECK (action IN ('record', 'quarantine', 'rma', 'reset', 'reboot')),
    state          TEXT NOT NULL CHECK (state IN ('open', 'resolved')),
    standing       BOOLEAN NOT NULL DEFAULT 0,
    count          BIGINT NOT NULL DEFAULT 1,
    occur_time     TIMESTAMP NOT NULL,
    create_time    TIMESTAMP NOT NULL,
    update_time    TIMESTAMP NOT NULL,
    resolve_time   TIMESTAMP,
    resolved_by    TEXT NOT NULL DEFAULT '',
    remediation_id TEXT NOT NULL DEFAULT ''
);
-- One open standing finding per (node, gpu, kind, code): a repeat report
-- counts on it, whatever two gateways raced to write.
CREATE UNIQUE INDEX health_findings_standing ON health_findings (node_id, gpu_uuid, kind, code)
    WHERE state = 'open' AND standing;
CREATE INDEX health_findings_node ON health_findings (node_id, state, id);
CREATE INDEX health_findings_tenant ON health_findings (tenant_id, id);
CREATE INDEX health_findings_pool ON health_findings (pool_id, state, create_time);

-- Remediations: the health reconciler's work on a node (or one of its
-- GPUs). One active remediation per node, held by the database.
CREATE TABLE health_remediations (
    id          TEXT PRIMARY KEY,
    node_id     TEXT NOT NULL,
    tenant_id   TEXT NOT NULL,
    pool_id     TEXT NOT NULL DEFAULT '',
    gpu_uuid    TEXT NOT NULL DEFAULT '',
    action      TEXT NOT NULL CHECK (action IN ('reset', 'reboot')),
    state       TEXT NOT NULL CHECK (state IN ('pending', 'draining', 'running', 'succeeded', 'failed', 'escalated', 'canceled')),
    reason      TEXT NOT NULL DEFAULT '',
    finding_id  TEXT NOT NULL DEFAULT '',
    workflow_id TEXT NOT NULL DEFAULT '',
    error       TEXT NOT NULL DEFAULT '',
    -- The reconciler drained the node (and undrains it when the remedy
    -- worked); false when an operator had drained it already.
    drained     BOOLEAN NOT NULL DEFAULT 0,
    create_time TIMESTAMP NOT NULL,
    start_time  TIMESTAMP,
    end_time    TIMESTAMP,
    update_time TIMESTAMP NOT NULL
);
CREATE UNIQUE INDEX health_remediations_active ON health_remediations (node_id)
    WHERE state IN ('pending', 'draining', 'running');
CREATE INDEX health_remediations_pool ON health_remediations (pool_id, state, create_time);
CREATE INDEX health_remediations_tenant ON health_remediations (tenant_id, id);

-- GPU quarantines: one row per GPU out of placement for health (a policy's
-- or an operator's). The node condition GpuQuarantined/<uuid> that
-- placement reads is written with it, in the same transaction.
CREATE TABLE health_gpus (
    gpu_uuid    TEXT PRIMARY KEY,
    node_id     TEXT NOT NULL,
    tenant_id   TEXT NOT NULL,
    -- The node's pool when the GPU went out ('' for none).
    pool_id     TEXT NOT NULL DEFAULT '',
    state       TEXT NOT NULL CHECK (state IN ('quarantined', 'rma')),
    reason      TEXT NOT NULL DEFAULT '',
    finding_id  TEXT NOT NULL DEFAULT '',
    created_by  TEXT NOT NULL DEFAULT '',
    create_time TIMESTAMP NOT NULL
);
CREATE INDEX health_gpus_node ON health_gpus (node_id);
CREATE INDEX health_gpus_pool ON health_gpus (pool_id);

-- Circuit breakers, one row per pool that ever tripped. A tripped breaker
-- stays open until an operator resets it.
CREATE TABLE health_breakers (
    pool_id     TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('closed', 'open')),
    reason      TEXT NOT NULL DEFAULT '',
    trip_time   TIMESTAMP,
    reset_time  TIMESTAMP,
    reset_by    TEXT NOT NULL DEFAULT '',
    trips       BIGINT NOT NULL DEFAULT 0,
    update_time TIMESTAMP NOT NULL
);
