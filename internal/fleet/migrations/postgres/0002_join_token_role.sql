-- The role a machine joining with a token gets (node, site or ramdisk):
-- the token decides it, not the joining agent. Tokens minted before this
-- column admit nodes only.
ALTER TABLE join_tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'node'
    CHECK (role IN ('node', 'site', 'ramdisk'));
