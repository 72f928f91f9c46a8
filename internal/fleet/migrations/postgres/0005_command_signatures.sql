-- Every command is signed as it is inserted (internal/cmdsig): the worker
-- certificate's serial, the trust version and the signature. A row without
-- one is refused by any bcd that pinned command-signing roots.
ALTER TABLE commands ADD COLUMN signer TEXT NOT NULL DEFAULT '';
ALTER TABLE commands ADD COLUMN trust_version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN signature BYTEA NOT NULL DEFAULT ''::bytea;
