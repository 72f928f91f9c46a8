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
    report_time  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (node_id, name)
);
CREATE INDEX site_agent_drivers_site ON site_agent_drivers (site_id, node_id, name);

-- A machine may name an external driver: bmc_driver is no longer limited
-- to ipmi and redfish.
ALTER TABLE machines DROP CONSTRAINT IF EXISTS machines_bmc_driver_check;
ALTER TABLE machines ADD CONSTRAINT machines_bmc_driver_check CHECK (bmc_driver <> '');
