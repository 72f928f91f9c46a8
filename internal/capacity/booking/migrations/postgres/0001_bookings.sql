CREATE EXTENSION IF NOT EXISTS btree_gist;

-- A booking holds one atom (a GPU, a MIG slice, an MPS share, a vCPU) over
-- [starts_at, ends_at) for a reservation. Two bookings of one atom never
-- overlap: the exclusion constraint refuses it, concurrent writers included.
CREATE TABLE bookings (
    id             TEXT PRIMARY KEY,
    reservation_id TEXT NOT NULL,
    atom           TEXT NOT NULL,
    starts_at      TIMESTAMPTZ NOT NULL,
    ends_at        TIMESTAMPTZ NOT NULL,
    create_time    TIMESTAMPTZ NOT NULL,
    CONSTRAINT bookings_range CHECK (ends_at > starts_at),
    CONSTRAINT bookings_no_overlap EXCLUDE USING gist (
        atom WITH =,
        tstzrange(starts_at, ends_at, '[)') WITH &&
    )
);

CREATE INDEX bookings_reservation ON bookings (reservation_id);
