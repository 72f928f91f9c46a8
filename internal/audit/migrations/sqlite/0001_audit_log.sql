CREATE TABLE audit_log (
    id             TEXT PRIMARY KEY,
    time           TIMESTAMP NOT NULL,
    tenant_id      TEXT NOT NULL,
    principal_id   TEXT NOT NULL,
    principal_kind TEXT NOT NULL,
    action         TEXT NOT NULL,
    resource_type  TEXT NOT NULL,
    resource_id    TEXT NOT NULL,
    decision       TEXT NOT NULL CHECK (decision IN ('allow', 'deny', 'confirmation_required', 'error')),
    request_id     TEXT NOT NULL,
    trace_id       TEXT NOT NULL,
    result         TEXT NOT NULL
);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, id);
