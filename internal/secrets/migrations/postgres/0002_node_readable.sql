-- node_readable: the tenant lets its own nodes fetch the secret with bcd
-- (AgentService.FetchSecret). Off for every existing secret; a platform
-- secret (tenant_id '') never has it.
ALTER TABLE secrets ADD COLUMN node_readable BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE secrets ADD CONSTRAINT secrets_platform_not_node_readable CHECK (tenant_id <> '' OR NOT node_readable);
