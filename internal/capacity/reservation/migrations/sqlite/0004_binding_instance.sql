-- Binding instance: a reservation the instance service books for one
-- guest, in the instance's own transaction; it may hold no GPU. SQLite
-- cannot change a CHECK in place: the table is rebuilt with the same
-- columns and indexes.
CREATE TABLE reservations_new (
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
    binding        TEXT NOT NULL CHECK (binding IN ('node', 'kubernetes', 'none', 'instance')),
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
    -- The active interval, for usage: set on entering and leaving active.
    active_since   TIMESTAMP,
    active_until   TIMESTAMP,
    created_by     TEXT NOT NULL,
    create_time    TIMESTAMP NOT NULL,
    update_time    TIMESTAMP NOT NULL,
    CONSTRAINT reservations_window CHECK (ends_at > starts_at)
);
INSERT INTO reservations_new SELECT * FROM reservations;
DROP TABLE reservations;
ALTER TABLE reservations_new RENAME TO reservations;
CREATE INDEX reservations_tenant ON reservations (tenant_id, id);
CREATE INDEX reservations_state ON reservations (state, create_time);
CREATE INDEX reservations_node ON reservations (node_id, state);
CREATE INDEX reservations_pool ON reservations (pool_id, state);
-- The flavor an instance's reservation was booked for: usage meters
-- instance.<flavor>.hours from it.
ALTER TABLE reservations ADD COLUMN flavor TEXT NOT NULL DEFAULT '';
