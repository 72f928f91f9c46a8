-- Binding machine: a dedicated-root lease of the whole machine behind a
-- node, bound by the metal module's lease.
ALTER TABLE reservations DROP CONSTRAINT reservations_binding_check;
ALTER TABLE reservations ADD CONSTRAINT reservations_binding_check CHECK (binding IN ('node', 'kubernetes', 'none', 'instance', 'machine'));
