-- Budgets: what a tenant may commit per period (month, week or day, UTC)
-- at its pools' prices, in micro-units of the platform's currency. One row
-- per tenant: Set replaces it. What is committed is not stored: it is
-- computed from reservations when a booking is checked or a budget read.
CREATE TABLE budgets (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL UNIQUE,
    period        TEXT NOT NULL CHECK (period IN ('month', 'week', 'day')),
    amount_micros INTEGER NOT NULL CHECK (amount_micros > 0),
    enforcement   TEXT NOT NULL CHECK (enforcement IN ('hard', 'soft')),
    -- Comma-separated percents, ascending.
    thresholds    TEXT NOT NULL,
    created_by    TEXT NOT NULL,
    create_time   TIMESTAMP NOT NULL,
    update_time   TIMESTAMP NOT NULL
);

-- The thresholds a budget's period has reached, each once: the row is what
-- makes its budget.threshold event go out once per period.
CREATE TABLE budget_thresholds (
    budget_id    TEXT NOT NULL,
    period_start TIMESTAMP NOT NULL,
    percent      INTEGER NOT NULL,
    reach_time   TIMESTAMP NOT NULL,
    PRIMARY KEY (budget_id, period_start, percent)
);
