-- Two-phase BMC password rotation: a new password is sealed into the
-- pending slot (bmc_pending_ref names it, bmc_pending_credential holds it
-- sealed under "machine-bmc/<bmc_pending_ref>") while the site agent sets
-- and checks it; it replaces bmc_credential only on the agent's signed
-- success. A failed rotation clears the slot and holds the machine in
-- maintenance (maintenance_reason non-empty) until a rotation succeeds.
ALTER TABLE machines ADD COLUMN bmc_pending_ref TEXT NOT NULL DEFAULT '';
ALTER TABLE machines ADD COLUMN bmc_pending_credential BYTEA;
ALTER TABLE machines ADD COLUMN maintenance_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE machines ADD COLUMN maintenance_time TIMESTAMPTZ;
