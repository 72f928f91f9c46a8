-- A lease may carry a capacity reservation (binding "machine"): a tenant
-- reserved the whole machine behind a node, and the lease binds it. The
-- reservation is the tenant's view of it (metered, in quotas); node_id is
-- the platform node the machine ran as, retired when the lessee's deploy
-- starts.
ALTER TABLE machine_leases ADD COLUMN reservation_id TEXT NOT NULL DEFAULT '';
ALTER TABLE machine_leases ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
CREATE INDEX machine_leases_reservation ON machine_leases (reservation_id) WHERE reservation_id <> '';
