-- Hot attach and detach: a volume is attaching or detaching while bcd
-- plugs it into (or out of) its instance's guest. SQLite cannot change a
-- CHECK in place: the table is rebuilt with the same columns and indexes.
CREATE TABLE volumes_new (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    size_gib    INTEGER NOT NULL CHECK (size_gib > 0),
    format      TEXT NOT NULL CHECK (format IN ('qcow2', 'raw')),
    state       TEXT NOT NULL CHECK (state IN ('creating', 'available', 'attaching', 'attached', 'detaching', 'deleting', 'deleted', 'failed')),
    instance_id TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    message     TEXT NOT NULL DEFAULT '',
    create_time TIMESTAMP NOT NULL,
    update_time TIMESTAMP NOT NULL
);
INSERT INTO volumes_new (id, tenant_id, name, size_gib, format, state, instance_id, node_id, message, create_time, update_time)
SELECT id, tenant_id, name, size_gib, format, state, instance_id, node_id, message, create_time, update_time FROM volumes;
DROP TABLE volumes;
ALTER TABLE volumes_new RENAME TO volumes;
CREATE UNIQUE INDEX volumes_name ON volumes (tenant_id, name) WHERE state <> 'deleted';
CREATE INDEX volumes_tenant ON volumes (tenant_id, id);
CREATE INDEX volumes_instance ON volumes (instance_id);
