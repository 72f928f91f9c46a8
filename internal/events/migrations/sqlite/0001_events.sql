-- The transactional outbox: events are written in the mutation's own
-- transaction and served to watchers by seq.
CREATE TABLE events (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    type          TEXT NOT NULL,
    tenant_id     TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_id   TEXT NOT NULL,
    time          TIMESTAMP NOT NULL,
    data          TEXT NOT NULL
);
CREATE INDEX events_tenant ON events (tenant_id, seq);
