-- The log and its tree are append-only in the database itself: the
-- control plane never updates or deletes these rows, and a statement that
-- tries is refused. (Whoever can drop a trigger can still tamper; the
-- signed checkpoints are what detects that: docs/audit.md.)
CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;
CREATE TRIGGER audit_leaves_no_update BEFORE UPDATE ON audit_leaves
BEGIN SELECT RAISE(ABORT, 'audit_leaves is append-only'); END;
CREATE TRIGGER audit_leaves_no_delete BEFORE DELETE ON audit_leaves
BEGIN SELECT RAISE(ABORT, 'audit_leaves is append-only'); END;
CREATE TRIGGER audit_nodes_no_update BEFORE UPDATE ON audit_nodes
BEGIN SELECT RAISE(ABORT, 'audit_nodes is append-only'); END;
CREATE TRIGGER audit_nodes_no_delete BEFORE DELETE ON audit_nodes
BEGIN SELECT RAISE(ABORT, 'audit_nodes is append-only'); END;
CREATE TRIGGER audit_checkpoints_no_update BEFORE UPDATE ON audit_checkpoints
BEGIN SELECT RAISE(ABORT, 'audit_checkpoints is append-only'); END;
CREATE TRIGGER audit_checkpoints_no_delete BEFORE DELETE ON audit_checkpoints
BEGIN SELECT RAISE(ABORT, 'audit_checkpoints is append-only'); END;
