-- Offers: a pool is owned by the tenant of its nodes and offered to other
-- tenants — to none (private), to all, or to the tenants listed in
-- pool_offers. A consumer reserves from an offered pool within its quotas.
ALTER TABLE pools ADD COLUMN offer TEXT NOT NULL DEFAULT 'private' CHECK (offer IN ('private', 'all', 'tenants'));
CREATE TABLE pool_offers (
    pool_id   TEXT NOT NULL REFERENCES pools (id),
    tenant_id TEXT NOT NULL REFERENCES tenants (id),
    PRIMARY KEY (pool_id, tenant_id)
);
-- A consumer's offered pools, found from its side.
CREATE INDEX pool_offers_tenant ON pool_offers (tenant_id, pool_id);
CREATE INDEX pools_offer_all ON pools (offer) WHERE offer = 'all';
