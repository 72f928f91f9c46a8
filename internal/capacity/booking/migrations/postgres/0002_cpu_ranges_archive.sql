-- CPUs are booked as a range per node, [cpu_lo, cpu_hi), instead of one
-- bookings row per CPU: a 64-CPU reservation writes one row, not 64. Two
-- bookings of one node's CPUs never overlap in both CPUs and time.
CREATE TABLE cpu_bookings (
    id             TEXT PRIMARY KEY,
    reservation_id TEXT NOT NULL,
    node_id        TEXT NOT NULL,
    cpu_lo         INTEGER NOT NULL,
    cpu_hi         INTEGER NOT NULL,
    starts_at      TIMESTAMPTZ NOT NULL,
    ends_at        TIMESTAMPTZ NOT NULL,
    create_time    TIMESTAMPTZ NOT NULL,
    CONSTRAINT cpu_bookings_range CHECK (ends_at > starts_at),
    CONSTRAINT cpu_bookings_cpus CHECK (cpu_lo >= 0 AND cpu_hi > cpu_lo),
    CONSTRAINT cpu_bookings_no_overlap EXCLUDE USING gist (
        node_id WITH =,
        int4range(cpu_lo, cpu_hi) WITH &&,
        tstzrange(starts_at, ends_at, '[)') WITH &&
    )
);

-- Existing per-CPU rows ("<node>/cpu/<n>") become ranges: contiguous CPUs of
-- one reservation over one time range make one row (gaps and islands: n
-- minus its rank is constant along a run). A range keeps its first row's id.
-- Rows this cannot parse stay in bookings, where they were.
INSERT INTO cpu_bookings (id, reservation_id, node_id, cpu_lo, cpu_hi, starts_at, ends_at, create_time)
SELECT MIN(id), reservation_id, node_id, MIN(cpu), MAX(cpu) + 1, starts_at, ends_at, MIN(create_time)
FROM (
    SELECT id, reservation_id, node_id, cpu, starts_at, ends_at, create_time,
           cpu - ROW_NUMBER() OVER (PARTITION BY reservation_id, node_id, starts_at, ends_at ORDER BY cpu) AS run
    FROM (
        SELECT id, reservation_id, starts_at, ends_at, create_time,
               regexp_replace(atom, '/cpu/[0-9]+$', '') AS node_id,
               substring(atom FROM '/cpu/([0-9]+)$')::integer AS cpu
        FROM bookings
        WHERE atom ~ '^.+/cpu/[0-9]{1,9}$'
    ) parsed
) runs
GROUP BY reservation_id, node_id, starts_at, ends_at, run;

DELETE FROM bookings WHERE atom ~ '^.+/cpu/[0-9]{1,9}$';

-- The overlap check and the placer's load probe (atom, ends_at): bookings
-- that ended before a new one starts are skipped by the index, so history
-- does not slow booking. ends_at alone serves the archive job's oldest-first
-- scan. (atom, starts_at) served the old probe, which walked all history.
CREATE INDEX bookings_atom_ends ON bookings (atom, ends_at);
CREATE INDEX bookings_ends ON bookings (ends_at);
CREATE INDEX cpu_bookings_node_ends ON cpu_bookings (node_id, ends_at);
CREATE INDEX cpu_bookings_ends ON cpu_bookings (ends_at);
CREATE INDEX cpu_bookings_reservation ON cpu_bookings (reservation_id);

-- Ended bookings move here (Archive), out of the constraint's and the
-- indexes' way. Same columns, no constraints: rows are history, never
-- booked against.
CREATE TABLE bookings_archive (
    id             TEXT NOT NULL,
    reservation_id TEXT NOT NULL,
    atom           TEXT NOT NULL,
    starts_at      TIMESTAMPTZ NOT NULL,
    ends_at        TIMESTAMPTZ NOT NULL,
    create_time    TIMESTAMPTZ NOT NULL
);
CREATE INDEX bookings_archive_reservation ON bookings_archive (reservation_id);

CREATE TABLE cpu_bookings_archive (
    id             TEXT NOT NULL,
    reservation_id TEXT NOT NULL,
    node_id        TEXT NOT NULL,
    cpu_lo         INTEGER NOT NULL,
    cpu_hi         INTEGER NOT NULL,
    starts_at      TIMESTAMPTZ NOT NULL,
    ends_at        TIMESTAMPTZ NOT NULL,
    create_time    TIMESTAMPTZ NOT NULL
);
CREATE INDEX cpu_bookings_archive_reservation ON cpu_bookings_archive (reservation_id);
