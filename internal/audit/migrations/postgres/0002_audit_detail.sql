-- The audit row of a mutation may say what it did beyond its resource:
-- reservations.exec keeps its (quoted, bounded) command line here.
ALTER TABLE audit_log ADD COLUMN detail TEXT NOT NULL DEFAULT '';
