-- The boot lease of a site: one connected site agent (holder_node_id)
-- runs the site's DHCP, TFTP, HTTP and BMC calls. Its heartbeats renew
-- expire_time; a standby agent of the same site takes over only once it
-- passed, under epoch + 1, and commands carry the epoch they were sent
-- under so a former holder's are refused.
CREATE TABLE site_boot_leases (
    site_id        TEXT PRIMARY KEY REFERENCES sites (id) ON DELETE CASCADE,
    holder_node_id TEXT NOT NULL,
    epoch          BIGINT NOT NULL,
    acquire_time   TIMESTAMPTZ NOT NULL,
    expire_time    TIMESTAMPTZ NOT NULL
);

-- A machine step handed to a site agent, by the step's idempotency key:
-- the command it became (command_id), or, with command_id '', a key
-- fenced by a Lookup that found it never dispatched — such a key is never
-- sent afterwards.
CREATE TABLE site_dispatches (
    idempotency_key TEXT PRIMARY KEY,
    site_id         TEXT NOT NULL,
    machine_id      TEXT NOT NULL,
    node_id         TEXT NOT NULL,
    command_id      TEXT NOT NULL,
    epoch           BIGINT NOT NULL,
    create_time     TIMESTAMPTZ NOT NULL
);
CREATE INDEX site_dispatches_command ON site_dispatches (command_id);

-- The boot each machine's iPXE script gives (ramdisk, rescue or disk),
-- set when a power.cycle step asks for one; a machine without a row
-- boots its local disk.
CREATE TABLE site_machine_boots (
    machine_id  TEXT PRIMARY KEY,
    boot        TEXT NOT NULL CHECK (boot IN ('ramdisk', 'rescue', 'disk')),
    update_time TIMESTAMPTZ NOT NULL
);
