-- The transactional outbox: events are written in the mutation's own
-- transaction and served to watchers by seq. Writers serialize on an
-- advisory lock so seq order is commit order (a watcher never skips a
-- sequence number that commits late).
CREATE TABLE events (
    seq           BIGSERIAL PRIMARY KEY,
    type          TEXT NOT NULL,
    tenant_id     TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_id   TEXT NOT NULL,
    time          TIMESTAMPTZ NOT NULL,
    data          JSONB NOT NULL
);
CREATE INDEX events_tenant ON events (tenant_id, seq);
