-- The log and its tree are append-only in the database itself: the
-- control plane never updates or deletes these rows, and a statement that
-- tries is refused. (Whoever can drop a trigger can still tamper; the
-- signed checkpoints are what detects that: docs/audit.md.)
CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME USING ERRCODE = 'check_violation';
END
$$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_leaves_append_only BEFORE UPDATE OR DELETE ON audit_leaves
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_leaves_no_truncate BEFORE TRUNCATE ON audit_leaves
    FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_nodes_append_only BEFORE UPDATE OR DELETE ON audit_nodes
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_checkpoints_append_only BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
