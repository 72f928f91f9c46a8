-- Binding instance: a reservation the instance service books for one
-- guest, in the instance's own transaction; it may hold no GPU.
ALTER TABLE reservations DROP CONSTRAINT reservations_binding_check;
ALTER TABLE reservations ADD CONSTRAINT reservations_binding_check CHECK (binding IN ('node', 'kubernetes', 'none', 'instance'));
-- The flavor an instance's reservation was booked for: usage meters
-- instance.<flavor>.hours from it.
ALTER TABLE reservations ADD COLUMN flavor TEXT NOT NULL DEFAULT '';
