-- Every command is signed as it is inserted (internal/cmdsig): the worker
-- certificate's serial, the trust version and the signature. A row without
-- one is refused by any bcd that pinned command-signing roots.
ALTER TABLE commands ADD COLUMN signer TEXT NOT NULL DEFAULT '';
ALTER TABLE commands ADD COLUMN trust_version INTEGER NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN signature BLOB NOT NULL DEFAULT x'';

-- What a node signed with its own key (internal/nodesig): a command's final
-- update or an allocation report, with the exact bytes and the certificate
-- that verified them, so anyone holding the node CA can check the record.
CREATE TABLE node_reports (
    id          TEXT PRIMARY KEY,
    node_id     TEXT NOT NULL,
    kind        TEXT NOT NULL,
    subject     TEXT NOT NULL,
    cert_der    BLOB NOT NULL,
    signed      BLOB NOT NULL,
    signature   BLOB NOT NULL,
    create_time TIMESTAMP NOT NULL
);
CREATE INDEX node_reports_subject ON node_reports (subject, create_time);
