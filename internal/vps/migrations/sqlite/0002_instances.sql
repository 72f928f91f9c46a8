-- Instances: one guest each, placed through capacity (reservation_id, a
-- reservation with binding instance) on node_id, with its address leased
-- from ip_pool_id. The flavor's sizes are copied: a flavor deleted later
-- does not change a running guest. conditions is JSON; ssh_keys is a JSON
-- list; user_data is never returned by the API.
CREATE TABLE instances (
    id             TEXT PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    project_id     TEXT NOT NULL,
    name           TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('pending', 'placing', 'booting', 'running', 'stopped', 'deleting', 'deleted', 'failed', 'lost')),
    flavor_id      TEXT NOT NULL,
    flavor_name    TEXT NOT NULL,
    vcpus          INTEGER NOT NULL,
    memory_mib     BIGINT NOT NULL,
    disk_gib       INTEGER NOT NULL,
    image          TEXT NOT NULL,
    image_sha256   TEXT NOT NULL,
    ip_pool_id     TEXT NOT NULL,
    ip_pool_name   TEXT NOT NULL,
    address        TEXT NOT NULL,
    prefix_len     INTEGER NOT NULL,
    gateway        TEXT NOT NULL,
    dns            TEXT NOT NULL,
    mac            TEXT NOT NULL,
    network_policy TEXT NOT NULL,
    ssh_keys       TEXT NOT NULL,
    user_data      TEXT NOT NULL,
    pool_id        TEXT NOT NULL,
    reservation_id TEXT NOT NULL,
    node_id        TEXT NOT NULL,
    node_name      TEXT NOT NULL,
    cpuset         TEXT NOT NULL,
    accel          TEXT NOT NULL DEFAULT '',
    ssh_address    TEXT NOT NULL DEFAULT '',
    conditions     TEXT NOT NULL DEFAULT '[]',
    message        TEXT NOT NULL DEFAULT '',
    created_by     TEXT NOT NULL,
    create_time    TIMESTAMP NOT NULL,
    update_time    TIMESTAMP NOT NULL
);
-- A name is taken until its instance is deleted.
CREATE UNIQUE INDEX instances_name ON instances (tenant_id, name) WHERE state <> 'deleted';
CREATE INDEX instances_tenant ON instances (tenant_id, id);
CREATE INDEX instances_node ON instances (node_id, state);

-- Volumes: a disk file on one host, attached to at most one instance there.
CREATE TABLE volumes (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    size_gib    INTEGER NOT NULL CHECK (size_gib > 0),
    format      TEXT NOT NULL CHECK (format IN ('qcow2', 'raw')),
    state       TEXT NOT NULL CHECK (state IN ('creating', 'available', 'attached', 'deleting', 'deleted', 'failed')),
    instance_id TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    message     TEXT NOT NULL DEFAULT '',
    create_time TIMESTAMP NOT NULL,
    update_time TIMESTAMP NOT NULL
);
CREATE UNIQUE INDEX volumes_name ON volumes (tenant_id, name) WHERE state <> 'deleted';
CREATE INDEX volumes_tenant ON volumes (tenant_id, id);
CREATE INDEX volumes_instance ON volumes (instance_id);
