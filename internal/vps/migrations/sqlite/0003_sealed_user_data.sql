-- An instance's user data is sealed at rest (AES-256-GCM under the
-- deployment secret, with the instance as associated data); the plaintext
-- column goes. It was read only when instance.create was sent, which
-- carried its own copy to the host, so existing rows lose nothing a guest
-- needs.
ALTER TABLE instances ADD COLUMN user_data_sealed BLOB NOT NULL DEFAULT x'';
ALTER TABLE instances DROP COLUMN user_data;
-- instance.create commands now store the seed's secrets sealed; those that
-- ended before keep no plaintext copy either (open ones are delivered as
-- they are stored, then end).
UPDATE commands SET params = json_remove(params, '$.seed.user_data', '$.seed.host_key')
    WHERE kind = 'instance.create' AND state IN ('succeeded', 'failed', 'canceled', 'expired') AND json_valid(params);
