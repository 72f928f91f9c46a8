-- keep: the snapshot outlives its sandbox (sandbox delete leaves it, and
-- its files on the host) and seeds new sandboxes until it is deleted.
-- instance_id is the instance it was taken of, whose directory holds it
-- on the host; image and disk_gib are what its disk is (a sandbox made
-- from it boots that image with a disk at least that large). Older rows
-- record no image: they restore in place but seed nothing.
ALTER TABLE sandbox_snapshots ADD COLUMN keep INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandbox_snapshots ADD COLUMN instance_id TEXT NOT NULL DEFAULT '';
ALTER TABLE sandbox_snapshots ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE sandbox_snapshots ADD COLUMN disk_gib INTEGER NOT NULL DEFAULT 0;
UPDATE sandbox_snapshots SET instance_id = COALESCE((SELECT s.instance_id FROM sandboxes s WHERE s.id = sandbox_snapshots.sandbox_id), '');
CREATE INDEX sandbox_snapshots_sandbox ON sandbox_snapshots (sandbox_id);
