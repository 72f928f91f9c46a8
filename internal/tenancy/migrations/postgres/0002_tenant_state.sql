-- A tenant's lifecycle: suspended refuses its principals' mutations,
-- deleting marks a cascade under way (see docs/tenants.md).
ALTER TABLE tenants ADD COLUMN state TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'suspended', 'deleting'));
