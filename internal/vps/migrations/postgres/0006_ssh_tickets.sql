-- SSH tunnel tickets, shared by every replica so that the ticket call and
-- GET /v1/ssh/tunnel may reach different ones (a load balancer). A ticket
-- is kept under the SHA-256 of its id, never the id (the credential);
-- redeeming deletes the row, so it opens one tunnel. Expired rows go as
-- new tickets are issued.
CREATE TABLE ssh_tickets (
    id_hash     TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    instance_id TEXT NOT NULL,
    host_id     TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    expire_time TIMESTAMPTZ NOT NULL
);
CREATE INDEX ssh_tickets_expire ON ssh_tickets (expire_time);
