-- Console sign-in sessions. id_hash is the SHA-256 (hex) of the cookie's
-- token, so a copy of this table signs nobody in; api_key is the pasted key
-- sealed (AES-256-GCM under BETTER_COMPUTE_SECRET, the row's id_hash as
-- associated data). csrf_token is checked against every form the session
-- posts. Rows past expire_time are refused and deleted.
CREATE TABLE console_sessions (
    id_hash      TEXT PRIMARY KEY,
    api_key      BYTEA NOT NULL,
    principal_id TEXT NOT NULL,
    csrf_token   TEXT NOT NULL,
    create_time  TIMESTAMPTZ NOT NULL,
    expire_time  TIMESTAMPTZ NOT NULL
);
CREATE INDEX console_sessions_expire ON console_sessions (expire_time);
CREATE INDEX console_sessions_principal ON console_sessions (principal_id);
