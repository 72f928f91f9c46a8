-- Where each gateway replica is reached by its peers: nodes.session_owner
-- names the replica, this row its replica-to-replica URL, so a replica
-- can bridge an SSH tunnel through the one holding the node's session.
-- A replica writes its row when it starts; a dead replica's row stays
-- until it starts again (no node names it as owner for long).
CREATE TABLE gateway_replicas (
    id          TEXT PRIMARY KEY,
    url         TEXT NOT NULL,
    update_time TIMESTAMP NOT NULL
);
