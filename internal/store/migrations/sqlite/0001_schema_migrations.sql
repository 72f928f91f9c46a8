-- The record of applied migrations, one row per module and version.
CREATE TABLE schema_migrations (
    module     TEXT NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT NOT NULL,
    applied_at TIMESTAMP NOT NULL,
    PRIMARY KEY (module, version)
);
