-- The deployment's SSH certificate authority for instances and sandboxes:
-- one Ed25519 key (id 'default'), created on first use. sealed_key is the
-- OpenSSH private key sealed with BETTER_COMPUTE_SECRET under the ref
-- 'vps/ssh_ca/<id>', base64; public_key is its authorized_keys form.
CREATE TABLE ssh_cas (
    id          TEXT PRIMARY KEY,
    public_key  TEXT NOT NULL,
    sealed_key  TEXT NOT NULL,
    create_time TIMESTAMPTZ NOT NULL
);
