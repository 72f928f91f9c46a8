CREATE TABLE idempotency_keys (
    principal_id TEXT NOT NULL,
    key          TEXT NOT NULL,
    procedure    TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    response     BLOB NOT NULL,
    create_time  TIMESTAMP NOT NULL,
    expire_time  TIMESTAMP NOT NULL,
    PRIMARY KEY (principal_id, key)
);
CREATE INDEX idempotency_keys_expire ON idempotency_keys (expire_time);

CREATE TABLE confirmations (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL,
    action        TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_id   TEXT NOT NULL,
    principal_id  TEXT NOT NULL,
    request_hash  TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'used', 'expired')),
    approved_by   TEXT NOT NULL,
    create_time   TIMESTAMP NOT NULL,
    expire_time   TIMESTAMP NOT NULL
);
CREATE INDEX confirmations_tenant ON confirmations (tenant_id, id);
