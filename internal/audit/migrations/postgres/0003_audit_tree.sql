-- The audit log as an RFC 6962 Merkle tree (see docs/audit.md).
--
-- audit.Insert adds each new row's id to audit_pending in the row's own
-- transaction; the sequencer (one at a time: it holds audit_tree's row
-- lock) moves pending ids into audit_leaves in id order, giving each its
-- leaf index after commit, so rows that commit out of id order still get
-- one index each, never two.
CREATE TABLE audit_pending (
    audit_id TEXT PRIMARY KEY
);
-- Every row written before this migration is sequenced first.
INSERT INTO audit_pending (audit_id) SELECT id FROM audit_log;

CREATE TABLE audit_leaves (
    seq       BIGINT PRIMARY KEY,
    audit_id  TEXT NOT NULL UNIQUE,
    leaf_hash BYTEA NOT NULL
);

-- Hashes of the perfect subtrees above the leaves (level >= 1), written as
-- the tree grows, so a proof reads O(log n) rows.
CREATE TABLE audit_nodes (
    level INTEGER NOT NULL,
    idx   BIGINT NOT NULL,
    hash  BYTEA NOT NULL,
    PRIMARY KEY (level, idx)
);

-- The tree's size and compact range (the right border's perfect subtree
-- hashes, 32 bytes each, concatenated): what the next append needs. Its
-- one row is the sequencer's fence.
CREATE TABLE audit_tree (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    size         BIGINT NOT NULL,
    range_hashes BYTEA NOT NULL
);
INSERT INTO audit_tree (id, size, range_hashes) VALUES (1, 0, '\x');

-- Signed checkpoints: the note is the signed-note text a verifier checks.
CREATE TABLE audit_checkpoints (
    size        BIGINT PRIMARY KEY,
    root_hash   BYTEA NOT NULL,
    note        TEXT NOT NULL,
    create_time TIMESTAMPTZ NOT NULL
);

-- The checkpoint signing key: an Ed25519 note key, sealed.
CREATE TABLE audit_signer (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    origin      TEXT NOT NULL,
    verifier    TEXT NOT NULL,
    key_sealed  BYTEA NOT NULL,
    create_time TIMESTAMPTZ NOT NULL
);
