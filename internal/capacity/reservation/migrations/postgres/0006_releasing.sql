-- Releasing: a kubernetes-bound reservation released (or ended) while the
-- node's pods may still hold its GPUs keeps its bookings until the node
-- reports AllocationReleased. ends_as is the state it then reaches;
-- release_time is when it began releasing.
ALTER TABLE reservations DROP CONSTRAINT reservations_state_check;
ALTER TABLE reservations ADD CONSTRAINT reservations_state_check
    CHECK (state IN ('pending', 'placed', 'binding', 'active', 'releasing', 'released', 'expired', 'failed', 'canceled'));
ALTER TABLE reservations ADD COLUMN ends_as TEXT NOT NULL DEFAULT '';
ALTER TABLE reservations ADD COLUMN release_time TIMESTAMPTZ;
