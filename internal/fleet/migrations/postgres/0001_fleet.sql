-- Nodes: machines that joined with a token, identified by their hardware key.
-- state is the lifecycle an operator drives (joining → active → draining →
-- drained; retired); liveness is what heartbeats say (ready → unreachable →
-- lost), computed with compute_now().
CREATE TABLE nodes (
    id               TEXT PRIMARY KEY,
    name             TEXT NOT NULL UNIQUE,
    tenant_id        TEXT NOT NULL,
    project_id       TEXT NOT NULL,
    pool             TEXT NOT NULL DEFAULT '',
    labels           TEXT NOT NULL DEFAULT '{}',
    hardware_key     TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('joining', 'active', 'draining', 'drained', 'retired')),
    liveness         TEXT NOT NULL CHECK (liveness IN ('ready', 'unreachable', 'lost')),
    mode             TEXT NOT NULL DEFAULT 'node',
    agent_version    TEXT NOT NULL DEFAULT '',
    capabilities     TEXT NOT NULL DEFAULT '[]',
    trust_version    BIGINT NOT NULL DEFAULT 0,
    last_heartbeat   TIMESTAMPTZ,
    session_owner    TEXT NOT NULL DEFAULT '',
    next_seq         BIGINT NOT NULL DEFAULT 0,
    last_applied_seq BIGINT NOT NULL DEFAULT 0,
    inventory_digest TEXT NOT NULL DEFAULT '',
    cert_serial      TEXT NOT NULL DEFAULT '',
    cert_not_after   TIMESTAMPTZ,
    create_time      TIMESTAMPTZ NOT NULL,
    update_time      TIMESTAMPTZ NOT NULL
);
-- One live node per machine: a retired node frees its hardware key.
CREATE UNIQUE INDEX nodes_hardware_key ON nodes (hardware_key) WHERE state <> 'retired';
CREATE INDEX nodes_tenant ON nodes (tenant_id, id);
CREATE INDEX nodes_liveness ON nodes (liveness, last_heartbeat);

CREATE TABLE node_conditions (
    node_id     TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    type        TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('true', 'false', 'unknown')),
    reason      TEXT NOT NULL,
    message     TEXT NOT NULL,
    update_time TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (node_id, type)
);

-- Join tokens: sealed, single-use, bound to the first CSR presented.
CREATE TABLE join_tokens (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    project_id  TEXT NOT NULL,
    pool        TEXT NOT NULL DEFAULT '',
    labels      TEXT NOT NULL DEFAULT '{}',
    created_by  TEXT NOT NULL,
    create_time TIMESTAMPTZ NOT NULL,
    expire_time TIMESTAMPTZ NOT NULL,
    revoke_time TIMESTAMPTZ,
    used_time   TIMESTAMPTZ,
    csr_sha256  TEXT NOT NULL DEFAULT '',
    node_id     TEXT NOT NULL DEFAULT ''
);
CREATE INDEX join_tokens_tenant ON join_tokens (tenant_id, id);

-- Deferred joins (unknown hardware, placeholder DMI): an approval admits
-- exactly one join.
CREATE TABLE join_requests (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    token_id     TEXT NOT NULL REFERENCES join_tokens (id),
    csr_sha256   TEXT NOT NULL,
    hardware_key TEXT NOT NULL,
    identity     TEXT NOT NULL,
    reason       TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'rejected', 'admitted')),
    decided_by   TEXT NOT NULL DEFAULT '',
    node_id      TEXT NOT NULL DEFAULT '',
    create_time  TIMESTAMPTZ NOT NULL,
    decide_time  TIMESTAMPTZ
);
CREATE UNIQUE INDEX join_requests_token ON join_requests (token_id);

-- Commands are rows first, messages second: a per-node sequence, delivered
-- at least once, applied at most once by the agent.
CREATE TABLE commands (
    id              TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    node_id         TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    seq             BIGINT NOT NULL,
    kind            TEXT NOT NULL,
    params          TEXT NOT NULL DEFAULT '{}',
    idempotency_key TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'accepted', 'running', 'succeeded', 'failed', 'canceled', 'expired')),
    progress        INTEGER NOT NULL DEFAULT 0,
    message         TEXT NOT NULL DEFAULT '',
    result          TEXT NOT NULL DEFAULT '{}',
    failure_code    TEXT NOT NULL DEFAULT '',
    traceparent     TEXT NOT NULL DEFAULT '',
    created_by      TEXT NOT NULL,
    deadline        TIMESTAMPTZ NOT NULL,
    create_time     TIMESTAMPTZ NOT NULL,
    update_time     TIMESTAMPTZ NOT NULL,
    CONSTRAINT commands_node_seq UNIQUE (node_id, seq),
    CONSTRAINT commands_node_idempotency UNIQUE (node_id, idempotency_key)
);
CREATE INDEX commands_open ON commands (node_id, state, seq);
CREATE INDEX commands_deadline ON commands (state, deadline);

-- Inventory: sections as received (verified by sha256), the snapshot digest
-- history with diffs, and the devices built from the latest snapshot.
CREATE TABLE inventory_sections (
    node_id     TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    data        BYTEA NOT NULL,
    update_time TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (node_id, name)
);
CREATE TABLE inventory_snapshots (
    node_id     TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    digest      TEXT NOT NULL,
    diff        TEXT NOT NULL DEFAULT '{}',
    create_time TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (node_id, digest)
);
CREATE TABLE gpus (
    uuid        TEXT PRIMARY KEY,
    node_id     TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    idx         INTEGER NOT NULL,
    model       TEXT NOT NULL,
    memory_mib  INTEGER NOT NULL,
    pci_bus_id  TEXT NOT NULL,
    numa_node   INTEGER NOT NULL,
    mig_mode    TEXT NOT NULL,
    update_time TIMESTAMPTZ NOT NULL
);
CREATE INDEX gpus_node ON gpus (node_id, idx);
CREATE TABLE mig_instances (
    uuid            TEXT PRIMARY KEY,
    gpu_uuid        TEXT NOT NULL REFERENCES gpus (uuid) ON DELETE CASCADE,
    profile         TEXT NOT NULL,
    gpu_instance_id INTEGER NOT NULL,
    memory_mib      INTEGER NOT NULL
);
CREATE TABLE nvlinks (
    node_id   TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    gpu_uuid  TEXT NOT NULL,
    peer_uuid TEXT NOT NULL,
    link      INTEGER NOT NULL,
    PRIMARY KEY (gpu_uuid, link)
);
CREATE TABLE numa_nodes (
    node_id       TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    numa_id       INTEGER NOT NULL,
    cpus          TEXT NOT NULL,
    memory_mib    INTEGER NOT NULL,
    hugepages_2mi INTEGER NOT NULL,
    hugepages_1gi INTEGER NOT NULL,
    PRIMARY KEY (node_id, numa_id)
);
CREATE TABLE node_resources (
    node_id             TEXT PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
    cpu_model           TEXT NOT NULL,
    sockets             INTEGER NOT NULL,
    cores               INTEGER NOT NULL,
    threads             INTEGER NOT NULL,
    memory_mib          INTEGER NOT NULL,
    hugepages_2mi_total INTEGER NOT NULL,
    hugepages_1gi_total INTEGER NOT NULL,
    update_time         TIMESTAMPTZ NOT NULL
);
