-- Site image fetch capabilities in use or used: a capability serves one
-- complete transfer to the site agent it was minted for. A row is claimed
-- when a fetch starts, deleted again if the transfer did not complete (so
-- the site's retry works), and pruned once the capability expired.
CREATE TABLE site_image_fetches (
    token_id    TEXT PRIMARY KEY,
    node_id     TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    claim_time  TIMESTAMP NOT NULL,
    expire_time TIMESTAMP NOT NULL
);
CREATE INDEX site_image_fetches_expire ON site_image_fetches (expire_time);
