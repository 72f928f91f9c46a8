-- A tenant's profile documents (docs/profiles.md): the text as written and
-- its expansion (the steps a workflow persists when it starts), so a
-- workflow never reads the document again and an update changes only the
-- workflows started after it. The built-in profiles ship in the binary.
CREATE TABLE profiles (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('DeployProfile', 'HardwareProfile')),
    description TEXT NOT NULL DEFAULT '',
    version     INTEGER NOT NULL DEFAULT 1,
    document    TEXT NOT NULL,
    format      TEXT NOT NULL CHECK (format IN ('yaml', 'json')),
    driver      TEXT NOT NULL DEFAULT '',
    expansion   TEXT NOT NULL,
    created_by  TEXT NOT NULL,
    create_time TIMESTAMPTZ NOT NULL,
    update_time TIMESTAMPTZ NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX profiles_tenant ON profiles (tenant_id, id);
