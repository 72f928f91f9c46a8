CREATE TABLE tenants (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL UNIQUE,
    display_name TEXT NOT NULL,
    create_time  TIMESTAMP NOT NULL
);

CREATE TABLE projects (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL REFERENCES tenants (id),
    name         TEXT NOT NULL,
    display_name TEXT NOT NULL,
    create_time  TIMESTAMP NOT NULL,
    CONSTRAINT projects_tenant_name UNIQUE (tenant_id, name)
);
