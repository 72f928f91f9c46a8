-- The image catalog. An image's bytes live in the blob directory under
-- sha256/<hex>; rows name them. tenant_id is '' for platform images.
CREATE TABLE images (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('raw', 'qcow2', 'kernel', 'initrd', 'ramdisk')),
    sha256      TEXT NOT NULL,
    size_bytes  INTEGER NOT NULL CHECK (size_bytes >= 0),
    visibility  TEXT NOT NULL CHECK (visibility IN ('private', 'public')),
    created_by  TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX images_tenant ON images (tenant_id, id);
CREATE INDEX images_public ON images (visibility, id);
CREATE INDEX images_sha256 ON images (sha256);

-- Signer allowlists: tenant_id '' is the platform's.
CREATE TABLE signer_keys (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    algorithm   TEXT NOT NULL CHECK (algorithm IN ('ed25519', 'ecdsa-p256')),
    fingerprint TEXT NOT NULL,
    public_key  BLOB NOT NULL,
    created_by  TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    UNIQUE (tenant_id, name),
    UNIQUE (tenant_id, fingerprint)
);

-- Signatures are kept by key fingerprint, not key id: a key removed from
-- its allowlist leaves its signatures in place, and they stop counting.
CREATE TABLE image_signatures (
    image_id        TEXT NOT NULL REFERENCES images (id) ON DELETE CASCADE,
    key_fingerprint TEXT NOT NULL,
    algorithm       TEXT NOT NULL,
    signature       BLOB NOT NULL,
    created_by      TEXT NOT NULL,
    create_time     TIMESTAMP NOT NULL,
    PRIMARY KEY (image_id, key_fingerprint)
);

-- What uses an image (a deployed machine, a site cache pin): an image with
-- a reference cannot be deleted. The deploy path writes and removes rows.
CREATE TABLE image_refs (
    image_id    TEXT NOT NULL REFERENCES images (id),
    ref_kind    TEXT NOT NULL,
    ref_id      TEXT NOT NULL,
    tenant_id   TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    PRIMARY KEY (image_id, ref_kind, ref_id)
);
