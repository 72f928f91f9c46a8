-- One row: the trust domain and the pin (SHA-256 of the root's SPKI).
CREATE TABLE pki_settings (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    trust_domain TEXT NOT NULL,
    pin          TEXT NOT NULL,
    create_time  TIMESTAMP NOT NULL
);

-- The CAs; key_sealed is NULL for an offline root.
CREATE TABLE pki_cas (
    kind       TEXT PRIMARY KEY CHECK (kind IN ('root', 'node', 'serving', 'internal')),
    cert_der   BLOB NOT NULL,
    key_sealed BLOB,
    not_after  TIMESTAMP NOT NULL
);

-- Every node certificate issued, for revocation.
CREATE TABLE pki_certs (
    serial        TEXT PRIMARY KEY,
    node_id       TEXT NOT NULL,
    role          TEXT NOT NULL,
    not_after     TIMESTAMP NOT NULL,
    issue_time    TIMESTAMP NOT NULL,
    revoke_time   TIMESTAMP,
    revoke_reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX pki_certs_node ON pki_certs (node_id, not_after);
CREATE INDEX pki_certs_revoked ON pki_certs (not_after) WHERE revoke_time IS NOT NULL;

-- Renew nonces seen, until they expire: the replay guard.
CREATE TABLE pki_nonces (
    nonce       TEXT PRIMARY KEY,
    expire_time TIMESTAMP NOT NULL
);
CREATE INDEX pki_nonces_expire ON pki_nonces (expire_time);
