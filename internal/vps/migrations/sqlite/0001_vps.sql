-- Flavors: the sizes of instances. tenant_id is '' for the platform's
-- flavors, which every tenant sees.
CREATE TABLE flavors (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    vcpus       INTEGER NOT NULL CHECK (vcpus > 0),
    memory_mib  BIGINT NOT NULL CHECK (memory_mib > 0),
    disk_gib    INTEGER NOT NULL CHECK (disk_gib > 0),
    gpus        INTEGER NOT NULL CHECK (gpus >= 0),
    gpu_model   TEXT NOT NULL,
    numa_affine INTEGER NOT NULL,
    pinned      INTEGER NOT NULL,
    hugepages   INTEGER NOT NULL,
    description TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX flavors_tenant ON flavors (tenant_id, id);

-- IP pools (IPAM): one IPv4 network, the range leases come from, and what
-- guests are told (gateway, nameservers). range_first/range_last are the
-- range's addresses as integers so allocation walks numbers.
CREATE TABLE ip_pools (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    cidr        TEXT NOT NULL,
    gateway     TEXT NOT NULL,
    dns         TEXT NOT NULL,
    range_first BIGINT NOT NULL,
    range_last  BIGINT NOT NULL CHECK (range_last >= range_first),
    network     TEXT NOT NULL,
    description TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX ip_pools_tenant ON ip_pools (tenant_id, id);

-- Leases: an address of a pool held by one holder. The primary key is the
-- invariant (one holder per address); a holder holds one address per pool.
CREATE TABLE ip_leases (
    pool_id     TEXT NOT NULL REFERENCES ip_pools (id),
    ordinal     BIGINT NOT NULL,
    address     TEXT NOT NULL,
    holder      TEXT NOT NULL,
    mac         TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    PRIMARY KEY (pool_id, ordinal),
    UNIQUE (pool_id, holder)
);
