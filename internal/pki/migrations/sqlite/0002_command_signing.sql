-- Command-signing generations: a root (its key sealed, or NULL when kept
-- offline) and the online CA it certified, which certifies the replicas'
-- 24-hour worker keys. seal is the sealed SHA-256 of (version, root, CA):
-- a generation written by anyone without the sealing secret is refused.
CREATE TABLE pki_command_cas (
    version         INTEGER PRIMARY KEY,
    root_der        BLOB NOT NULL,
    root_key_sealed BLOB,
    ca_der          BLOB NOT NULL,
    ca_key_sealed   BLOB NOT NULL,
    seal            BLOB NOT NULL,
    create_time     TIMESTAMP NOT NULL,
    retire_time     TIMESTAMP
);

-- Worker certificates: the gateway sends a command's signer chain with it.
CREATE TABLE pki_command_signers (
    serial     TEXT PRIMARY KEY,
    version    INTEGER NOT NULL,
    cert_der   BLOB NOT NULL,
    replica    TEXT NOT NULL,
    not_after  TIMESTAMP NOT NULL,
    issue_time TIMESTAMP NOT NULL
);
