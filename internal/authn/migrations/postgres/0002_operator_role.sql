-- The operator role: a member who also drains nodes and acts on GPU health.
ALTER TABLE api_keys DROP CONSTRAINT api_keys_role_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_role_check CHECK (role IN ('platform-admin', 'admin', 'operator', 'member', 'viewer', 'agent'));
