-- The replica whose placer owns each pool, and the API URL other replicas
-- forward that pool's mutations to. The row is written by the replica that
-- took the pool's advisory lock (PostgreSQL); a batch checks it under the
-- pool's row lock, so a placer that lost its lock stops at its next batch.
CREATE TABLE placer_owners (
    pool_id    TEXT PRIMARY KEY,
    replica_id TEXT NOT NULL,
    url        TEXT NOT NULL,
    since      TIMESTAMPTZ NOT NULL
);
