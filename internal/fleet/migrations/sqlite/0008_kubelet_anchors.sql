-- Trust anchors for the kubelet attestor: a Kubernetes cluster's CA, whose
-- kubelet client certificates (CN=system:node:NAME) admit that cluster's
-- nodes (docs/attestation.md). SQLite cannot change a CHECK in place: the
-- table is rebuilt with the same rows (nothing references it by key).
CREATE TABLE trust_anchors_v8 (
    id               TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL,
    name             TEXT NOT NULL,
    attestor         TEXT NOT NULL CHECK (attestor IN ('tpm', 'x509', 'cloud', 'kubelet')),
    certificates_pem TEXT NOT NULL DEFAULT '',
    ek_public_sha256 TEXT NOT NULL DEFAULT '',
    cloud_account    TEXT NOT NULL DEFAULT '',
    cloud_region     TEXT NOT NULL DEFAULT '',
    created_by       TEXT NOT NULL,
    create_time      TIMESTAMP NOT NULL,
    UNIQUE (tenant_id, name)
);
INSERT INTO trust_anchors_v8 (id, tenant_id, name, attestor, certificates_pem, ek_public_sha256, cloud_account, cloud_region, created_by, create_time)
    SELECT id, tenant_id, name, attestor, certificates_pem, ek_public_sha256, cloud_account, cloud_region, created_by, create_time FROM trust_anchors;
DROP TABLE trust_anchors;
ALTER TABLE trust_anchors_v8 RENAME TO trust_anchors;
CREATE INDEX trust_anchors_attestor ON trust_anchors (tenant_id, attestor, id);
