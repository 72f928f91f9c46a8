-- What happens to an instance when its host is declared lost: keep (it
-- stays lost) or recreate (it is placed again from its image elsewhere).
ALTER TABLE instances ADD COLUMN on_host_lost TEXT NOT NULL DEFAULT 'keep';
