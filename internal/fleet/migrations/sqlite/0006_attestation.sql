-- Attestation (docs/attestation.md). A trust anchor is what a tenant trusts
-- to vouch for its machines: EK CAs or a pinned EK (tpm), a machine CA
-- (x509), a cloud provider's certificate and account (cloud). A join token
-- may require an attestor; a node records what admitted it and what the
-- attestor proved it is.
CREATE TABLE trust_anchors (
    id               TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL,
    name             TEXT NOT NULL,
    attestor         TEXT NOT NULL CHECK (attestor IN ('tpm', 'x509', 'cloud')),
    certificates_pem TEXT NOT NULL DEFAULT '',
    ek_public_sha256 TEXT NOT NULL DEFAULT '',
    cloud_account    TEXT NOT NULL DEFAULT '',
    cloud_region     TEXT NOT NULL DEFAULT '',
    created_by       TEXT NOT NULL,
    create_time      TIMESTAMP NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX trust_anchors_attestor ON trust_anchors (tenant_id, attestor, id);
ALTER TABLE join_tokens ADD COLUMN attestor TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN attestor TEXT NOT NULL DEFAULT 'join_token';
ALTER TABLE nodes ADD COLUMN attested_id TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN trust_anchor_id TEXT NOT NULL DEFAULT '';
