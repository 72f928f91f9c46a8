-- Quorum batches of destructive commands, and each tenant's approver sets.
-- An approver set is never updated: every change is a new epoch, so the
-- set a batch was approved under stays readable.
CREATE TABLE approver_sets (
    tenant_id   TEXT NOT NULL,
    epoch       INTEGER NOT NULL CHECK (epoch >= 1),
    threshold   INTEGER NOT NULL CHECK (threshold >= 1),
    -- JSON array of authorized_keys lines, sorted.
    keys        TEXT NOT NULL,
    digest      TEXT NOT NULL,
    -- JSON array of {key_id, signature}: the previous quorum's approvals.
    approvals   TEXT NOT NULL DEFAULT '[]',
    created_by  TEXT NOT NULL,
    create_time TIMESTAMP NOT NULL,
    PRIMARY KEY (tenant_id, epoch)
);

CREATE TABLE command_batches (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'ran', 'canceled')),
    root          TEXT NOT NULL,
    epoch         INTEGER NOT NULL,
    threshold     INTEGER NOT NULL,
    trust_domain  TEXT NOT NULL,
    description   TEXT NOT NULL DEFAULT '',
    payload_bytes INTEGER NOT NULL,
    created_by    TEXT NOT NULL,
    create_time   TIMESTAMP NOT NULL,
    expire_time   TIMESTAMP NOT NULL,
    update_time   TIMESTAMP NOT NULL
);
CREATE INDEX command_batches_tenant ON command_batches (tenant_id, id);

CREATE TABLE command_batch_leaves (
    batch_id      TEXT NOT NULL REFERENCES command_batches (id) ON DELETE CASCADE,
    idx           INTEGER NOT NULL,
    kind          TEXT NOT NULL,
    subject       TEXT NOT NULL,
    -- The node, or the machine of a power leaf, the subject resolved to.
    target_id     TEXT NOT NULL,
    params        TEXT NOT NULL,
    params_sha256 TEXT NOT NULL,
    command_id    TEXT NOT NULL DEFAULT '',
    workflow_id   TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (batch_id, idx)
);

-- One approval per key and batch: the primary key refuses a second.
CREATE TABLE command_batch_approvals (
    batch_id     TEXT NOT NULL REFERENCES command_batches (id) ON DELETE CASCADE,
    key_id       TEXT NOT NULL,
    signature    TEXT NOT NULL,
    approved_by  TEXT NOT NULL,
    create_time  TIMESTAMP NOT NULL,
    PRIMARY KEY (batch_id, key_id)
);
