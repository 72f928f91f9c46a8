-- Webhook endpoints of a tenant. secret and previous_secret are sealed
-- (AES-256-GCM under BETTER_COMPUTE_SECRET); the previous one signs too
-- until previous_secret_expire_time. event_cursor is the outbox event id the
-- dispatcher has read up to (0: from the first event).
CREATE TABLE webhooks (
    id                          TEXT PRIMARY KEY,
    tenant_id                   TEXT NOT NULL,
    url                         TEXT NOT NULL,
    types                       TEXT NOT NULL DEFAULT '',
    description                 TEXT NOT NULL DEFAULT '',
    state                       TEXT NOT NULL CHECK (state IN ('enabled', 'disabled')),
    disabled_reason             TEXT NOT NULL DEFAULT '',
    secret                      BLOB NOT NULL,
    previous_secret             BLOB,
    previous_secret_expire_time TIMESTAMP,
    event_cursor                    INTEGER NOT NULL DEFAULT 0,
    failing_since               TIMESTAMP,
    created_by                  TEXT NOT NULL,
    create_time                 TIMESTAMP NOT NULL,
    update_time                 TIMESTAMP NOT NULL
);
CREATE INDEX webhooks_tenant ON webhooks (tenant_id, id);
-- One row per event sent to one endpoint, in seq order per endpoint: the
-- endpoint's oldest pending delivery goes first and the rest wait.
CREATE TABLE webhook_deliveries (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT NOT NULL UNIQUE,
    webhook_id        TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    tenant_id         TEXT NOT NULL,
    event_id          TEXT NOT NULL,
    event_type        TEXT NOT NULL,
    payload           BLOB NOT NULL,
    state             TEXT NOT NULL CHECK (state IN ('pending', 'succeeded', 'dead')),
    attempts          INTEGER NOT NULL DEFAULT 0,
    last_status       INTEGER NOT NULL DEFAULT 0,
    last_error        TEXT NOT NULL DEFAULT '',
    first_attempt_time TIMESTAMP,
    next_attempt_time TIMESTAMP NOT NULL,
    create_time       TIMESTAMP NOT NULL,
    update_time       TIMESTAMP NOT NULL
);
CREATE INDEX webhook_deliveries_head ON webhook_deliveries (webhook_id, state, seq);
