-- The provider side of instances on provider pools: which account and
-- server type an instance's server is rented with, the provider's id of
-- the server once it exists, and what the reconciler is to make true
-- (desired: running, stopped or deleted; power: an action not yet sent).
-- active_since/active_until bound the metered interval.
CREATE TABLE provider_instances (
    instance_id  TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    project_id   TEXT NOT NULL,
    pool_id      TEXT NOT NULL,
    account_id   TEXT NOT NULL,
    server_type  TEXT NOT NULL,
    image        TEXT NOT NULL,
    location     TEXT NOT NULL DEFAULT '',
    ssh_keys     TEXT NOT NULL DEFAULT '[]',
    server_id    TEXT NOT NULL DEFAULT '',
    desired      TEXT NOT NULL CHECK (desired IN ('running', 'stopped', 'deleted')),
    power        TEXT NOT NULL DEFAULT '',
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT NOT NULL DEFAULT '',
    done         BOOLEAN NOT NULL DEFAULT FALSE,
    -- A converge job holds the row while it calls the provider: one call
    -- at a time per instance, whichever job and replica.
    lease_until  TIMESTAMPTZ,
    active_since TIMESTAMPTZ,
    active_until TIMESTAMPTZ,
    create_time  TIMESTAMPTZ NOT NULL,
    update_time  TIMESTAMPTZ NOT NULL
);
CREATE INDEX provider_instances_account ON provider_instances (account_id, instance_id);
CREATE INDEX provider_instances_open ON provider_instances (done, instance_id);

-- Every join token minted for an instance's server: each create attempt
-- mints one (the token is never stored), and the server joins with
-- whichever attempt made it.
CREATE TABLE provider_instance_tokens (
    instance_id TEXT NOT NULL,
    token_id    TEXT NOT NULL,
    PRIMARY KEY (instance_id, token_id)
);
