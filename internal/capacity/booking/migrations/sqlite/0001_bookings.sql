-- A booking holds one atom (a GPU, a MIG slice, an MPS share, a vCPU) over
-- [starts_at, ends_at) for a reservation. Two bookings of one atom never
-- overlap: the triggers below refuse it. That is correct without locking
-- because SQLite has one writer. Times are fixed-width UTC text
-- (store.SQLiteTimeLayout), so text comparison orders them.
CREATE TABLE bookings (
    id             TEXT PRIMARY KEY,
    reservation_id TEXT NOT NULL,
    atom           TEXT NOT NULL,
    starts_at      TIMESTAMP NOT NULL,
    ends_at        TIMESTAMP NOT NULL,
    create_time    TIMESTAMP NOT NULL,
    CONSTRAINT bookings_range CHECK (ends_at > starts_at)
);

CREATE INDEX bookings_atom_starts ON bookings (atom, starts_at);
CREATE INDEX bookings_reservation ON bookings (reservation_id);

CREATE TRIGGER bookings_no_overlap_insert
BEFORE INSERT ON bookings
FOR EACH ROW
WHEN EXISTS (
    SELECT 1 FROM bookings b
    WHERE b.atom = NEW.atom
      AND b.id <> NEW.id
      AND b.starts_at < NEW.ends_at
      AND NEW.starts_at < b.ends_at
)
BEGIN
    SELECT RAISE(ABORT, 'bookings_no_overlap');
END;

CREATE TRIGGER bookings_no_overlap_update
BEFORE UPDATE OF atom, starts_at, ends_at ON bookings
FOR EACH ROW
WHEN EXISTS (
    SELECT 1 FROM bookings b
    WHERE b.atom = NEW.atom
      AND b.id <> NEW.id
      AND b.starts_at < NEW.ends_at
      AND NEW.starts_at < b.ends_at
)
BEGIN
    SELECT RAISE(ABORT, 'bookings_no_overlap');
END;
