-- The record of applied migrations, one row per module and version.
CREATE TABLE schema_migrations (
    module     TEXT NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (module, version)
);

-- compute_now() is the only clock SQL may read. A test or simulation sets
-- bc.now for its transaction (the store does it when its Go clock is not the
-- real one); otherwise it is the statement's start time. This is the one place
-- allowed to read the database's own clock.
CREATE FUNCTION compute_now() RETURNS timestamptz
LANGUAGE sql STABLE
AS $$
    SELECT COALESCE(NULLIF(current_setting('bc.now', true), '')::timestamptz, statement_timestamp()) -- clock-source
$$;
