-- Discovery tokens: one per ramdisk boot of a machine, minted when the
-- workflow power-cycles it into the ramdisk and carried on the kernel
-- command line. Only the secret's sha256 is stored. A token admits one
-- ramdisk that reports the machine's MAC (csr_sha256 binds the join), and
-- is deleted when the workflow ends. public_key is the ramdisk's key (PKIX
-- DER, base64) that signs its wipe records.
CREATE TABLE machine_discovery_tokens (
    id            TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL UNIQUE,
    machine_id    TEXT NOT NULL REFERENCES machines (id),
    site_id       TEXT NOT NULL,
    mac           TEXT NOT NULL,
    workflow_id   TEXT NOT NULL,
    create_time   TIMESTAMPTZ NOT NULL,
    expire_time   TIMESTAMPTZ NOT NULL,
    used_time     TIMESTAMPTZ,
    csr_sha256    TEXT NOT NULL DEFAULT '',
    node_id       TEXT NOT NULL DEFAULT '',
    public_key    TEXT NOT NULL DEFAULT ''
);
CREATE INDEX machine_discovery_tokens_machine ON machine_discovery_tokens (machine_id, workflow_id);
