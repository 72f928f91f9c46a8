-- Marks of the objects `fleet apply` manages (tenant_id '' for the
-- platform's): the spec last applied and its digest, by kind and name.
CREATE TABLE fleet_managed (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    kind        TEXT NOT NULL,
    name        TEXT NOT NULL,
    digest      TEXT NOT NULL,
    spec_json   TEXT NOT NULL,
    apply_time  TIMESTAMP NOT NULL,
    applied_by  TEXT NOT NULL,
    UNIQUE (tenant_id, kind, name)
);
CREATE INDEX fleet_managed_tenant ON fleet_managed (tenant_id, id);
