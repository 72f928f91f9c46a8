-- A tenant's lifecycle: a suspended tenant's principals read but change
-- nothing (see docs/tenants.md).
ALTER TABLE tenants ADD COLUMN state TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'suspended'));
