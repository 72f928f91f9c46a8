-- Workflows: one run of a profile against a target (a machine), owned by a
-- tenant. spec is the profile as it was when the workflow started (and the
-- cleanup profiles it names), so editing a profile never changes a running
-- workflow.
CREATE TABLE provision_workflows (
    id               TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL,
    target_id        TEXT NOT NULL,
    profile          TEXT NOT NULL,
    spec             TEXT NOT NULL,
    input            TEXT NOT NULL DEFAULT '{}',
    state            TEXT NOT NULL CHECK (state IN ('pending', 'running', 'paused', 'succeeded', 'failed', 'cancelled')),
    cancel_requested BOOLEAN NOT NULL DEFAULT false,
    failed_step      TEXT NOT NULL DEFAULT '',
    reason           TEXT NOT NULL DEFAULT '',
    created_by       TEXT NOT NULL DEFAULT '',
    create_time      TIMESTAMPTZ NOT NULL,
    update_time      TIMESTAMPTZ NOT NULL,
    end_time         TIMESTAMPTZ
);
-- One active workflow per target: a second start on a busy machine is
-- refused by the database, whatever the code checked first.
CREATE UNIQUE INDEX provision_workflows_active ON provision_workflows (target_id)
    WHERE state IN ('pending', 'running', 'paused');
CREATE INDEX provision_workflows_tenant ON provision_workflows (tenant_id, id);
CREATE INDEX provision_workflows_target ON provision_workflows (target_id, id);
CREATE INDEX provision_workflows_state ON provision_workflows (state, id);

-- Steps: the workflow's steps as rows, in order (idx); cleanup steps are
-- appended when a failure runs a cleanup profile. attempt counts claims
-- (each with its own idempotency key), failures counts the failures the
-- retry budget is spent on.
CREATE TABLE provision_steps (
    id              TEXT PRIMARY KEY,
    workflow_id     TEXT NOT NULL REFERENCES provision_workflows (id) ON DELETE CASCADE,
    idx             INTEGER NOT NULL,
    phase           TEXT NOT NULL CHECK (phase IN ('main', 'cleanup')),
    name            TEXT NOT NULL,
    kind            TEXT NOT NULL,
    destructive     BOOLEAN NOT NULL,
    params          TEXT NOT NULL DEFAULT '{}',
    timeout_ms      BIGINT NOT NULL,
    retries         INTEGER NOT NULL,
    backoff_ms      BIGINT NOT NULL,
    on_failure      TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('pending', 'running', 'awaiting', 'succeeded', 'failed', 'skipped')),
    attempt         INTEGER NOT NULL DEFAULT 0,
    failures        INTEGER NOT NULL DEFAULT 0,
    idempotency_key TEXT NOT NULL DEFAULT '',
    dispatched      BOOLEAN NOT NULL DEFAULT false,
    handle          TEXT NOT NULL DEFAULT '',
    lease_until     TIMESTAMPTZ,
    deadline        TIMESTAMPTZ,
    not_before      TIMESTAMPTZ,
    output          TEXT NOT NULL DEFAULT '{}',
    logs            TEXT NOT NULL DEFAULT '',
    error           TEXT NOT NULL DEFAULT '',
    start_time      TIMESTAMPTZ,
    end_time        TIMESTAMPTZ,
    update_time     TIMESTAMPTZ NOT NULL,
    -- A step is never in flight without the key its dispatch carries.
    CONSTRAINT provision_steps_key_in_flight CHECK (state NOT IN ('running', 'awaiting') OR idempotency_key <> ''),
    CONSTRAINT provision_steps_order UNIQUE (workflow_id, idx)
);
-- One in-flight step per workflow.
CREATE UNIQUE INDEX provision_steps_in_flight ON provision_steps (workflow_id)
    WHERE state IN ('running', 'awaiting');
-- The sweep looks for in-flight steps past their deadline or lease.
CREATE INDEX provision_steps_due ON provision_steps (state, deadline);

-- Attempts: one row per idempotency key, written in the transaction that
-- claims the step, before anything is dispatched. A key is never claimed
-- twice (the primary key), and its state says what became of it.
CREATE TABLE provision_attempts (
    idempotency_key TEXT PRIMARY KEY,
    step_id         TEXT NOT NULL REFERENCES provision_steps (id) ON DELETE CASCADE,
    workflow_id     TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    destructive     BOOLEAN NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('claimed', 'dispatched', 'succeeded', 'failed', 'fenced', 'unknown', 'abandoned')),
    handle          TEXT NOT NULL DEFAULT '',
    error           TEXT NOT NULL DEFAULT '',
    claim_time      TIMESTAMPTZ NOT NULL,
    end_time        TIMESTAMPTZ,
    CONSTRAINT provision_attempts_step UNIQUE (step_id, attempt)
);
