-- Ownership of a pool's placer is fenced by an epoch: each claim (after the
-- pool's advisory lock is taken) moves it, and every placer batch reads the
-- row FOR SHARE and goes on only if it still holds the epoch it claimed. A
-- replica that lost its lock without noticing (a dropped lock session, a
-- pause) cannot commit a batch after another replica claimed the pool.
ALTER TABLE placer_owners ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
