-- Order the outbox by commit visibility instead of a global writer lock:
-- each event carries the id of the transaction that wrote it, and readers
-- serve only events whose transaction is below their snapshot's xmin (every
-- such transaction has ended, so no event with a smaller key can still
-- appear), in (xid, seq) order. Existing rows get this migration's xid, which
-- keeps their seq order and places them before every later event.
ALTER TABLE events ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX events_order ON events (xid, seq);
CREATE INDEX events_tenant_order ON events (tenant_id, xid, seq);
DROP INDEX events_tenant;
-- events_visible is what readers read: the events whose transaction ended
-- before the reading statement's snapshot was taken (pg_current_snapshot()
-- is the statement's own snapshot under READ COMMITTED, so the rows it
-- returns and the horizon it applies agree).
CREATE VIEW events_visible AS
    SELECT seq, xid, type, tenant_id, resource_type, resource_id, time, data FROM events
    WHERE xid < pg_snapshot_xmin(pg_current_snapshot());
