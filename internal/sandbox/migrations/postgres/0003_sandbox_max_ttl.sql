-- max_ttl_s is the template's max_ttl as it was at create: extend is
-- bounded by it even after the template was deleted (templates are never
-- edited, so it is the same bound while the template lives). 0: unknown
-- (a sandbox of a template deleted before this migration).
ALTER TABLE sandboxes ADD COLUMN max_ttl_s BIGINT NOT NULL DEFAULT 0;
UPDATE sandboxes SET max_ttl_s = COALESCE((SELECT t.max_ttl_s FROM sandbox_templates t WHERE t.id = sandboxes.template_id), 0);
