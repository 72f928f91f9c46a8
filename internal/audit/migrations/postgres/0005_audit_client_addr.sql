-- The caller's address (serve --trusted-proxies): the peer's, or the client a
-- trusted proxy names in X-Forwarded-For. Part of the leaf (docs/audit.md).
ALTER TABLE audit_log ADD COLUMN client_addr TEXT NOT NULL DEFAULT '';
