-- Fleet CA generations after the first (pki_cas is generation 1): a root
-- and its node, serving and internal CAs, written by `pki rotate`. seal is
-- the sealed SHA-256 of the generation and its four certificates, so a
-- generation written by anyone without the sealing secret is refused.
CREATE TABLE pki_generations (
    generation          INTEGER PRIMARY KEY CHECK (generation > 1),
    root_der            BYTEA NOT NULL,
    root_key_sealed     BYTEA,
    node_der            BYTEA NOT NULL,
    node_key_sealed     BYTEA NOT NULL,
    serving_der         BYTEA NOT NULL,
    serving_key_sealed  BYTEA NOT NULL,
    internal_der        BYTEA NOT NULL,
    internal_key_sealed BYTEA NOT NULL,
    seal                BYTEA NOT NULL,
    create_time         TIMESTAMPTZ NOT NULL
);

-- The generation that serves (the gateway's and replicas' certificates, the
-- pin); older ones are retired, newer ones published and issuing nodes.
ALTER TABLE pki_settings ADD COLUMN serving_generation INTEGER NOT NULL DEFAULT 1;

-- Which generation issued a node certificate, and when a renewal replaced
-- it: a rotation finishes when no live, unreplaced certificate is older.
ALTER TABLE pki_certs ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
ALTER TABLE pki_certs ADD COLUMN supersede_time TIMESTAMPTZ;
CREATE INDEX pki_certs_generation ON pki_certs (generation, not_after);

-- A published command-signing generation is pinned by nodes as they renew;
-- replicas sign with it only once it is activated.
ALTER TABLE pki_command_cas ADD COLUMN activate_time TIMESTAMPTZ;
UPDATE pki_command_cas SET activate_time = create_time;
