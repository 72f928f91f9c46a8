-- A flavor whose guests' memory may be ballooned (docs/instances.md), and
-- the least memory the balloon leaves them (0: what an instance books).
ALTER TABLE flavors ADD COLUMN balloon INTEGER NOT NULL DEFAULT 0;
ALTER TABLE flavors ADD COLUMN min_memory_mib BIGINT NOT NULL DEFAULT 0;
-- The balloon floor an instance was created with (0: no balloon); kept
-- on the row so a redelivered instance.create asks for the same.
ALTER TABLE instances ADD COLUMN balloon_floor_mib BIGINT NOT NULL DEFAULT 0;
