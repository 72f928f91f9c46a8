-- Hourly usage of reservations: one row per reservation, metric and hour
-- window [window_start, window_start + 1h), written by the usage rollup
-- (idempotent upserts) from the reservations' active intervals. Metrics:
-- gpu.<model>.hours, vcpu.hours, memoryGiB.hours.
CREATE TABLE usage_windows (
    tenant_id      TEXT NOT NULL,
    project_id     TEXT NOT NULL,
    reservation_id TEXT NOT NULL,
    metric         TEXT NOT NULL,
    window_start   TIMESTAMPTZ NOT NULL,
    quantity       DOUBLE PRECISION NOT NULL,
    update_time    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (reservation_id, metric, window_start)
);
CREATE INDEX usage_windows_tenant ON usage_windows (tenant_id, window_start);

-- The rollup's progress: every window ending at or before closed_until was
-- closed by a run, so the next run starts from there (less a grace hour).
CREATE TABLE usage_cursor (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    closed_until TIMESTAMPTZ NOT NULL
);
