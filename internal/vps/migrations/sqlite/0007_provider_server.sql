-- An instance of a provider pool is a server at the provider: its id there
-- (package providerpools records it once the provider made the server).
ALTER TABLE instances ADD COLUMN provider_server_id TEXT NOT NULL DEFAULT '';
