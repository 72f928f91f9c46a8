-- Workload identity signing keys (ES256): the private key sealed under the
-- ref pki/workload/<kid>/key and nothing else, so the JWKS publishes only
-- public keys derived from keys that open (a row written without the
-- sealing secret fails the JWKS rather than joining it). The newest (by
-- seq) signs; the JWKS holds the newest two, so tokens of the previous key
-- verify until they expire.
CREATE TABLE pki_workload_keys (
    kid         TEXT PRIMARY KEY,
    -- Order of creation, 1 up: the clock may not tell two rotations apart.
    seq         INTEGER NOT NULL UNIQUE,
    key_sealed  BLOB NOT NULL,
    create_time TIMESTAMP NOT NULL
);
