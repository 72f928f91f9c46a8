-- restoring names the snapshot a sandbox is being restored to, until its
-- host answers instance.restore ('' when none): the sandbox reads
-- 'restoring' meanwhile, and a second restore or a snapshot waits for it.
ALTER TABLE sandboxes ADD COLUMN restoring TEXT NOT NULL DEFAULT '';
