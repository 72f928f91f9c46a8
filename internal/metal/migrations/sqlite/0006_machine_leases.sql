-- Dedicated-root machine leases (binding "machine"): a whole machine lent
-- to a lessee tenant, deployed with the lessee's image under the lessee's
-- trust, and torn down on release. The machine row keeps the lease it is
-- under (lease_id) and the firmware its commissioning saw
-- (firmware_baseline, JSON): a teardown's inventory must match it, else the
-- machine is quarantined.
ALTER TABLE machines ADD COLUMN lease_id TEXT NOT NULL DEFAULT '';
ALTER TABLE machines ADD COLUMN firmware_baseline TEXT NOT NULL DEFAULT '{}';

CREATE TABLE machine_leases (
  id TEXT PRIMARY KEY,
  machine_id TEXT NOT NULL REFERENCES machines(id),
  -- The owner is the machine's tenant; the lessee is the tenant the
  -- machine is lent to (its own tenant too, for an owner's own use).
  owner_tenant_id TEXT NOT NULL,
  lessee_tenant_id TEXT NOT NULL,
  state TEXT NOT NULL,
  image_id TEXT NOT NULL,
  image_name TEXT NOT NULL,
  image_sha256 TEXT NOT NULL,
  ssh_key_fingerprint TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  created_by TEXT NOT NULL,
  released_by TEXT NOT NULL DEFAULT '',
  create_time TIMESTAMP NOT NULL,
  update_time TIMESTAMP NOT NULL,
  release_time TIMESTAMP,
  end_time TIMESTAMP
);
CREATE INDEX machine_leases_lessee ON machine_leases (lessee_tenant_id, id);
CREATE INDEX machine_leases_machine ON machine_leases (machine_id, id);
-- A machine is under at most one lease that has not ended.
CREATE UNIQUE INDEX machine_leases_one_open ON machine_leases (machine_id)
  WHERE state <> 'returned';

-- The teardown's evidence, one row per step: what was verified (digest of
-- the signed payload) and who signed it.
CREATE TABLE machine_lease_evidence (
  lease_id TEXT NOT NULL REFERENCES machine_leases(id),
  step TEXT NOT NULL,
  kind TEXT NOT NULL,
  workflow_id TEXT NOT NULL,
  verified INTEGER NOT NULL,
  digest TEXT NOT NULL,
  signer TEXT NOT NULL,
  detail TEXT NOT NULL,
  create_time TIMESTAMP NOT NULL,
  PRIMARY KEY (lease_id, step)
);

-- A lease's teardown fences its machine: boot "fenced" makes the site's
-- iPXE decision treat it as unknown (no DHCP boot answer) until the
-- teardown boots the ramdisk. The check constraint gains it (the table is
-- rebuilt: SQLite cannot alter a check).
CREATE TABLE site_machine_boots_v2 (
    machine_id  TEXT PRIMARY KEY,
    boot        TEXT NOT NULL CHECK (boot IN ('ramdisk', 'rescue', 'disk', 'fenced')),
    update_time TIMESTAMP NOT NULL
);
INSERT INTO site_machine_boots_v2 (machine_id, boot, update_time) SELECT machine_id, boot, update_time FROM site_machine_boots;
DROP TABLE site_machine_boots;
ALTER TABLE site_machine_boots_v2 RENAME TO site_machine_boots;
