-- Sites: a tenant's provisioning networks. tenant_id is '' for the
-- platform's own sites. networks is a JSON array of CIDRs.
CREATE TABLE sites (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    networks    TEXT NOT NULL,
    dhcp_mode   TEXT NOT NULL CHECK (dhcp_mode IN ('full', 'proxy')),
    description TEXT NOT NULL,
    create_time TIMESTAMPTZ NOT NULL,
    update_time TIMESTAMPTZ NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX sites_tenant ON sites (tenant_id, id);

-- Machines: bare-metal servers of a site. The BMC password is sealed
-- (bmc_credential) and never leaves the control plane but to the site
-- agent; workflow_id names the machine's active workflow (the provision
-- engine holds the one-active-workflow invariant).
CREATE TABLE machines (
    id                 TEXT PRIMARY KEY,
    tenant_id          TEXT NOT NULL,
    site_id            TEXT NOT NULL REFERENCES sites (id),
    name               TEXT NOT NULL,
    bmc_driver         TEXT NOT NULL CHECK (bmc_driver IN ('ipmi', 'redfish')),
    bmc_address        TEXT NOT NULL,
    bmc_host           TEXT NOT NULL,
    bmc_username       TEXT NOT NULL,
    bmc_credential_ref TEXT NOT NULL,
    bmc_credential     BYTEA NOT NULL,
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
    rescue_expire_time TIMESTAMPTZ,
    create_time        TIMESTAMPTZ NOT NULL,
    update_time        TIMESTAMPTZ NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX machines_tenant ON machines (tenant_id, id);
CREATE INDEX machines_site ON machines (site_id, id);
-- A MAC boots one machine, and a BMC drives one: across every tenant, while
-- the machine is not retired.
CREATE UNIQUE INDEX machines_mac ON machines (mac) WHERE state <> 'retired';
CREATE UNIQUE INDEX machines_bmc ON machines (site_id, bmc_address) WHERE state <> 'retired';
