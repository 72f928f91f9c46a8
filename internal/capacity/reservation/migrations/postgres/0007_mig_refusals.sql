-- Creates refused for want of capacity, per pool, GPU model and MIG profile
-- and per minute: with the queue, the demand the MIG repartitioner reads for
-- a pool with mig: auto. A refused create writes nothing of its own, so the
-- count is written in a transaction of its own once the refusal is final.
CREATE TABLE mig_refusals (
    pool_id TEXT NOT NULL,
    model   TEXT NOT NULL,
    profile TEXT NOT NULL,
    bucket  TIMESTAMPTZ NOT NULL,
    count   BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (pool_id, bucket, model, profile)
);
