CREATE TABLE tenant_policies (
    tenant_id   TEXT NOT NULL,
    id          TEXT NOT NULL,
    text        TEXT NOT NULL,
    update_time TIMESTAMP NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
