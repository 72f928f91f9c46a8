-- The BMC drivers each site agent reported when its session opened (its
-- Hello): the built-ins and the external drivers of its drivers
-- directory. A Hello replaces the agent's rows; capabilities is a JSON
-- array. A machine's bmc_driver must be one of the drivers of the agent
-- that holds its site's boot lease when a step is dispatched.
CREATE TABLE site_agent_drivers (
    node_id      TEXT NOT NULL,
    site_id      TEXT NOT NULL REFERENCES sites (id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    reports      TEXT NOT NULL,
    version      TEXT NOT NULL,
    built_in     INTEGER NOT NULL,
    path         TEXT NOT NULL,
    capabilities TEXT NOT NULL,
    report_time  TIMESTAMP NOT NULL,
    PRIMARY KEY (node_id, name)
);
CREATE INDEX site_agent_drivers_site ON site_agent_drivers (site_id, node_id, name);

-- A machine may name an external driver: bmc_driver is no longer limited
-- to ipmi and redfish. SQLite cannot change a CHECK in place: the table is
-- rebuilt with the same columns and indexes. Rows referencing machines
-- (discovery tokens, leases) stay: foreign keys are checked at commit, and
-- the rows are inserted back into a table named machines (a renamed table
-- would not count as their parent again), so each reference is satisfied.
PRAGMA defer_foreign_keys = ON;
CREATE TABLE machines_old AS SELECT * FROM machines;
DROP TABLE machines;
CREATE TABLE machines (
    id                 TEXT PRIMARY KEY,
    tenant_id          TEXT NOT NULL,
    site_id            TEXT NOT NULL REFERENCES sites (id),
    name               TEXT NOT NULL,
    bmc_driver         TEXT NOT NULL CHECK (bmc_driver <> ''),
    bmc_address        TEXT NOT NULL,
    bmc_host           TEXT NOT NULL,
    bmc_username       TEXT NOT NULL,
    bmc_credential_ref TEXT NOT NULL,
    bmc_credential     BLOB NOT NULL,
    mac                TEXT NOT NULL,
    hardware_profile   TEXT NOT NULL,
    state              TEXT NOT NULL CHECK (state IN ('enrolled', 'inspecting', 'commissioning', 'ready', 'deploying',
                           'deployed', 'releasing', 'rescuing', 'rescue', 'retired', 'failed')),
    workflow_id        TEXT NOT NULL,
    operation          TEXT NOT NULL,
    commissioned       INTEGER NOT NULL,
    image_id           TEXT NOT NULL,
    image_name         TEXT NOT NULL,
    failed_operation   TEXT NOT NULL,
    failed_step        TEXT NOT NULL,
    failure_reason     TEXT NOT NULL,
    failure_logs       TEXT NOT NULL,
    inventory          TEXT NOT NULL,
    erase_record       TEXT NOT NULL,
    rescue_expire_time TIMESTAMP,
    create_time        TIMESTAMP NOT NULL,
    update_time        TIMESTAMP NOT NULL,
    bmc_pending_ref        TEXT NOT NULL DEFAULT '',
    bmc_pending_credential BLOB,
    maintenance_reason     TEXT NOT NULL DEFAULT '',
    maintenance_time       TIMESTAMP,
    lease_id               TEXT NOT NULL DEFAULT '',
    firmware_baseline      TEXT NOT NULL DEFAULT '{}',
    UNIQUE (tenant_id, name)
);
INSERT INTO machines SELECT * FROM machines_old;
DROP TABLE machines_old;
CREATE INDEX machines_tenant ON machines (tenant_id, id);
CREATE INDEX machines_site ON machines (site_id, id);
CREATE UNIQUE INDEX machines_mac ON machines (mac) WHERE state <> 'retired';
CREATE UNIQUE INDEX machines_bmc ON machines (site_id, bmc_address) WHERE state <> 'retired';
