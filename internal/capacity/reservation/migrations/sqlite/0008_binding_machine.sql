-- Binding machine: a dedicated-root lease of the whole machine behind a
-- node, bound by the metal module's lease. SQLite cannot change a CHECK in
-- place: the table is rebuilt with the same columns and indexes.
CREATE TABLE reservations_new (
    id             TEXT PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    project_id     TEXT NOT NULL,
    pool_id        TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('pending', 'placed', 'binding', 'active', 'releasing', 'released', 'expired', 'failed', 'canceled')),
    gpus           INTEGER NOT NULL,
    model          TEXT NOT NULL DEFAULT '',
    mig_profile    TEXT NOT NULL DEFAULT '',
    slots          INTEGER NOT NULL DEFAULT 0,
    vcpu           INTEGER NOT NULL DEFAULT 0,
    memory_gib     INTEGER NOT NULL DEFAULT 0,
    hugepages_1gi  INTEGER NOT NULL DEFAULT 0,
    binding        TEXT NOT NULL CHECK (binding IN ('node', 'kubernetes', 'none', 'instance', 'machine')),
    single_tenant  INTEGER NOT NULL DEFAULT 0,
    starts_at      TIMESTAMP NOT NULL,
    ends_at        TIMESTAMP NOT NULL,
    node_id        TEXT NOT NULL DEFAULT '',
    gpu_model      TEXT NOT NULL DEFAULT '',
    placement      TEXT NOT NULL DEFAULT '{}',
    conditions     TEXT NOT NULL DEFAULT '[]',
    explanation    TEXT NOT NULL DEFAULT '{}',
    command_id     TEXT NOT NULL DEFAULT '',
    bind_attempts  INTEGER NOT NULL DEFAULT 0,
    bind_deadline  TIMESTAMP,
    -- The active interval, for usage: set on entering active and when the
    -- bookings end.
    active_since   TIMESTAMP,
    active_until   TIMESTAMP,
    created_by     TEXT NOT NULL,
    create_time    TIMESTAMP NOT NULL,
    update_time    TIMESTAMP NOT NULL,
    flavor         TEXT NOT NULL DEFAULT '',
    ends_as        TEXT NOT NULL DEFAULT '',
    release_time   TIMESTAMP,
    CONSTRAINT reservations_window CHECK (ends_at > starts_at)
);
INSERT INTO reservations_new (id, tenant_id, project_id, pool_id, state, gpus, model, mig_profile, slots, vcpu, memory_gib,
    hugepages_1gi, binding, single_tenant, starts_at, ends_at, node_id, gpu_model, placement, conditions, explanation,
    command_id, bind_attempts, bind_deadline, active_since, active_until, created_by, create_time, update_time, flavor, ends_as, release_time)
SELECT id, tenant_id, project_id, pool_id, state, gpus, model, mig_profile, slots, vcpu, memory_gib,
    hugepages_1gi, binding, single_tenant, starts_at, ends_at, node_id, gpu_model, placement, conditions, explanation,
    command_id, bind_attempts, bind_deadline, active_since, active_until, created_by, create_time, update_time, flavor, ends_as, release_time
FROM reservations;
DROP TABLE reservations;
ALTER TABLE reservations_new RENAME TO reservations;
CREATE INDEX reservations_tenant ON reservations (tenant_id, id);
CREATE INDEX reservations_state ON reservations (state, create_time);
CREATE INDEX reservations_node ON reservations (node_id, state);
CREATE INDEX reservations_pool ON reservations (pool_id, state);
