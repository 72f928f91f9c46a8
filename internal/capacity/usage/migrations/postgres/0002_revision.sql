-- A window's revision: 1 when the rollup first writes it, one more each
-- time a later rollup changes it (an active interval recorded late). The
-- usage.window_closed event carries it, so a billing system keeps the
-- highest revision of each window.
ALTER TABLE usage_windows ADD COLUMN revision BIGINT NOT NULL DEFAULT 1;
