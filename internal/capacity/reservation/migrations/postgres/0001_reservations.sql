-- Pool membership: a node of a tenant belongs to the one active pool of that
-- tenant whose selector matches its labels. A node two pools match is in
-- none; conflict says which, and the node carries a PoolConflict condition.
CREATE TABLE node_pools (
    node_id     TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    pool_id     TEXT NOT NULL DEFAULT '',
    conflict    TEXT NOT NULL DEFAULT '',
    update_time TIMESTAMPTZ NOT NULL
);
CREATE INDEX node_pools_pool ON node_pools (pool_id, node_id);

-- Atoms are the unit of booking, kept in step with inventory by the atoms
-- reconciler: whole GPUs (<uuid>), MIG instances (<uuid>/mig/<profile>/<n>),
-- shared slots (<uuid>/s<k>) and CPUs (<node>/cpu/<n>).
CREATE TABLE atoms (
    id                TEXT PRIMARY KEY,
    node_id           TEXT NOT NULL,
    kind              TEXT NOT NULL CHECK (kind IN ('gpu', 'mig', 'slot', 'cpu')),
    gpu_uuid          TEXT NOT NULL DEFAULT '',
    model             TEXT NOT NULL DEFAULT '',
    gpu_index         INTEGER NOT NULL DEFAULT 0,
    numa              INTEGER NOT NULL DEFAULT 0,
    island            INTEGER NOT NULL DEFAULT -1,
    memory_mib        INTEGER NOT NULL DEFAULT 0,
    profile           TEXT NOT NULL DEFAULT '',
    quarantined       BOOLEAN NOT NULL DEFAULT false,
    partition_pending BOOLEAN NOT NULL DEFAULT false,
    update_time       TIMESTAMPTZ NOT NULL
);
CREATE INDEX atoms_node ON atoms (node_id, kind);

-- Host resources a node can hand out: inventory minus the pool's
-- hostReserve, hugepage pools excluded from memory.
CREATE TABLE host_resources (
    node_id       TEXT PRIMARY KEY,
    vcpu          INTEGER NOT NULL,
    memory_gib    INTEGER NOT NULL,
    hugepages_2mi INTEGER NOT NULL,
    hugepages_1gi INTEGER NOT NULL,
    reserved_cpus TEXT NOT NULL DEFAULT '',
    version       INTEGER NOT NULL DEFAULT 0,
    update_time   TIMESTAMPTZ NOT NULL
);

CREATE TABLE reservations (
    id             TEXT PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    project_id     TEXT NOT NULL,
    pool_id        TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('pending', 'placed', 'binding', 'active', 'released', 'expired', 'failed', 'canceled')),
    gpus           INTEGER NOT NULL,
    model          TEXT NOT NULL DEFAULT '',
    mig_profile    TEXT NOT NULL DEFAULT '',
    slots          INTEGER NOT NULL DEFAULT 0,
    vcpu           INTEGER NOT NULL DEFAULT 0,
    memory_gib     INTEGER NOT NULL DEFAULT 0,
    hugepages_1gi  INTEGER NOT NULL DEFAULT 0,
    binding        TEXT NOT NULL CHECK (binding IN ('node', 'kubernetes', 'none')),
    single_tenant  BOOLEAN NOT NULL DEFAULT false,
    starts_at      TIMESTAMPTZ NOT NULL,
    ends_at        TIMESTAMPTZ NOT NULL,
    node_id        TEXT NOT NULL DEFAULT '',
    gpu_model      TEXT NOT NULL DEFAULT '',
    placement      TEXT NOT NULL DEFAULT '{}',
    conditions     TEXT NOT NULL DEFAULT '[]',
    explanation    TEXT NOT NULL DEFAULT '{}',
    command_id     TEXT NOT NULL DEFAULT '',
    bind_attempts  INTEGER NOT NULL DEFAULT 0,
    bind_deadline  TIMESTAMPTZ,
    -- The active interval, for usage: set on entering and leaving active.
    active_since   TIMESTAMPTZ,
    active_until   TIMESTAMPTZ,
    created_by     TEXT NOT NULL,
    create_time    TIMESTAMPTZ NOT NULL,
    update_time    TIMESTAMPTZ NOT NULL,
    CONSTRAINT reservations_window CHECK (ends_at > starts_at)
);
CREATE INDEX reservations_tenant ON reservations (tenant_id, id);
CREATE INDEX reservations_state ON reservations (state, create_time);
CREATE INDEX reservations_node ON reservations (node_id, state);
CREATE INDEX reservations_pool ON reservations (pool_id, state);

-- Capacity rollups as insert-only deltas, so concurrent bookings never wait
-- on one counter row; the compactor folds them and `capacity rebuild`
-- recomputes them. key: (pool_id, model, kind).
CREATE TABLE capacity_deltas (
    id          BIGSERIAL PRIMARY KEY,
    pool_id     TEXT NOT NULL,
    model       TEXT NOT NULL,
    kind        TEXT NOT NULL,
    total       INTEGER NOT NULL DEFAULT 0,
    booked      INTEGER NOT NULL DEFAULT 0,
    quarantined INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX capacity_deltas_key ON capacity_deltas (pool_id, model, kind);

-- Bumped when a pool's nodes or atoms change, so every process reloads its
-- in-memory index of the pool.
CREATE TABLE pool_versions (
    pool_id TEXT PRIMARY KEY,
    version BIGINT NOT NULL
);
