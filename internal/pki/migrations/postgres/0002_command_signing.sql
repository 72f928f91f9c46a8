-- Command-signing generations: a root (its key sealed, or NULL when kept
-- offline) and the online CA it certified, which certifies the replicas'
-- 24-hour worker keys. seal is the sealed SHA-256 of (version, root, CA):
-- a generation written by anyone without the sealing secret is refused.
CREATE TABLE pki_command_cas (
    version         INTEGER PRIMARY KEY,
    root_der        BYTEA NOT NULL,
    root_key_sealed BYTEA,
    ca_der          BYTEA NOT NULL,
    ca_key_sealed   BYTEA NOT NULL,
    seal            BYTEA NOT NULL,
    create_time     TIMESTAMPTZ NOT NULL,
    retire_time     TIMESTAMPTZ
);

-- Worker certificates: the gateway sends a command's signer chain with it.
CREATE TABLE pki_command_signers (
    serial     TEXT PRIMARY KEY,
    version    INTEGER NOT NULL,
    cert_der   BYTEA NOT NULL,
    replica    TEXT NOT NULL,
    not_after  TIMESTAMPTZ NOT NULL,
    issue_time TIMESTAMPTZ NOT NULL
);
