-- Rollouts of a bcd release to a pool's nodes, wave by wave. The nodes are
-- fixed at create (rollout_nodes), so a node joining later is not touched.
CREATE TABLE rollouts (
    id                TEXT PRIMARY KEY,
    release           TEXT NOT NULL,
    pool_id           TEXT NOT NULL,
    pool_name         TEXT NOT NULL,
    -- JSON arrays: the waves as given ("1", "10%") and each wave's node count.
    waves             TEXT NOT NULL,
    wave_nodes        TEXT NOT NULL,
    max_unavailable   INTEGER NOT NULL CHECK (max_unavailable >= 1),
    pause_between_s   BIGINT NOT NULL,
    soak_s            BIGINT NOT NULL,
    revert_after_s    BIGINT NOT NULL,
    state             TEXT NOT NULL CHECK (state IN ('running', 'paused', 'halted', 'rolled_back', 'completed', 'aborted')),
    current_wave      INTEGER NOT NULL DEFAULT 0,
    -- When the current wave started (NULL: not yet) and when it may start
    -- (the pause after the previous wave).
    wave_start_time   TIMESTAMPTZ,
    wave_not_before   TIMESTAMPTZ,
    message           TEXT NOT NULL DEFAULT '',
    created_by        TEXT NOT NULL DEFAULT '',
    create_time       TIMESTAMPTZ NOT NULL,
    update_time       TIMESTAMPTZ NOT NULL,
    end_time          TIMESTAMPTZ
);
-- One active rollout per pool, held by the database.
CREATE UNIQUE INDEX rollouts_active_pool ON rollouts (pool_id) WHERE state IN ('running', 'paused', 'halted');
CREATE INDEX rollouts_state ON rollouts (state, id);

CREATE TABLE rollout_nodes (
    rollout_id          TEXT NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
    node_id             TEXT NOT NULL,
    node_name           TEXT NOT NULL,
    wave                INTEGER NOT NULL,
    from_version        TEXT NOT NULL DEFAULT '',
    state               TEXT NOT NULL CHECK (state IN ('pending', 'upgrading', 'soaking', 'done', 'failed', 'rolled_back')),
    command_id          TEXT NOT NULL DEFAULT '',
    rollback_command_id TEXT NOT NULL DEFAULT '',
    -- The rollback reached from_version (the node is back on it).
    rolled_back         BOOLEAN NOT NULL DEFAULT FALSE,
    message             TEXT NOT NULL DEFAULT '',
    send_time           TIMESTAMPTZ,
    soak_time           TIMESTAMPTZ,
    update_time         TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (rollout_id, node_id)
);
CREATE INDEX rollout_nodes_wave ON rollout_nodes (rollout_id, wave, node_name);
