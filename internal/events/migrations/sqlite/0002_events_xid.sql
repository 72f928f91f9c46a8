-- The outbox's order key is (xid, seq) on both stores. SQLite has one
-- writer, so seq order is already commit order: xid is always 0 here.
ALTER TABLE events ADD COLUMN xid INTEGER NOT NULL DEFAULT 0;
CREATE INDEX events_order ON events (xid, seq);
CREATE INDEX events_tenant_order ON events (tenant_id, xid, seq);
DROP INDEX events_tenant;
-- events_visible is what readers read; with one writer every committed
-- event is final, so there is no horizon to apply.
CREATE VIEW events_visible AS
    SELECT seq, xid, type, tenant_id, resource_type, resource_id, time, data FROM events;
