-- CPUs are booked as a range per node, [cpu_lo, cpu_hi), instead of one
-- bookings row per CPU: a 64-CPU reservation writes one row, not 64. Two
-- bookings of one node's CPUs never overlap in both CPUs and time; the
-- triggers below refuse it (SQLite has one writer).
CREATE TABLE cpu_bookings (
    id             TEXT PRIMARY KEY,
    reservation_id TEXT NOT NULL,
    node_id        TEXT NOT NULL,
    cpu_lo         INTEGER NOT NULL,
    cpu_hi         INTEGER NOT NULL,
    starts_at      TIMESTAMP NOT NULL,
    ends_at        TIMESTAMP NOT NULL,
    create_time    TIMESTAMP NOT NULL,
    CONSTRAINT cpu_bookings_range CHECK (ends_at > starts_at),
    CONSTRAINT cpu_bookings_cpus CHECK (cpu_lo >= 0 AND cpu_hi > cpu_lo)
);

-- Existing per-CPU rows ("<node>/cpu/<n>") become ranges: contiguous CPUs of
-- one reservation over one time range make one row (gaps and islands: n
-- minus its rank is constant along a run). A range keeps its first row's id.
-- Rows this cannot parse (a suffix that is not 1 to 9 digits) stay in
-- bookings, where they were.
INSERT INTO cpu_bookings (id, reservation_id, node_id, cpu_lo, cpu_hi, starts_at, ends_at, create_time)
SELECT MIN(id), reservation_id, node_id, MIN(cpu), MAX(cpu) + 1, starts_at, ends_at, MIN(create_time)
FROM (
    SELECT id, reservation_id, node_id, cpu, starts_at, ends_at, create_time,
           cpu - ROW_NUMBER() OVER (PARTITION BY reservation_id, node_id, starts_at, ends_at ORDER BY cpu) AS run
    FROM (
        SELECT id, reservation_id, starts_at, ends_at, create_time,
               substr(atom, 1, instr(atom, '/cpu/') - 1) AS node_id,
               CAST(substr(atom, instr(atom, '/cpu/') + 5) AS INTEGER) AS cpu
        FROM bookings
        WHERE instr(atom, '/cpu/') > 1
          AND length(substr(atom, instr(atom, '/cpu/') + 5)) BETWEEN 1 AND 9
          AND substr(atom, instr(atom, '/cpu/') + 5) NOT GLOB '*[^0-9]*'
    ) parsed
) runs
GROUP BY reservation_id, node_id, starts_at, ends_at, run;

DELETE FROM bookings
WHERE instr(atom, '/cpu/') > 1
  AND length(substr(atom, instr(atom, '/cpu/') + 5)) BETWEEN 1 AND 9
  AND substr(atom, instr(atom, '/cpu/') + 5) NOT GLOB '*[^0-9]*';

-- The overlap check probes (atom, ends_at): its WHERE names the atom and
-- "ends after the new one starts", so the index skips every booking that
-- ended before, and history does not slow booking. (atom, starts_at) made
-- the old trigger walk all of an atom's past bookings. ends_at alone serves
-- the archive job's oldest-first scan and the placer's load.
DROP INDEX bookings_atom_starts;
CREATE INDEX bookings_atom_ends ON bookings (atom, ends_at);
CREATE INDEX bookings_ends ON bookings (ends_at);
CREATE INDEX cpu_bookings_node_ends ON cpu_bookings (node_id, ends_at);
CREATE INDEX cpu_bookings_ends ON cpu_bookings (ends_at);
CREATE INDEX cpu_bookings_reservation ON cpu_bookings (reservation_id);

-- RAISE names the constraint and then the atom (or node), so an error says
-- which atom was taken, as PostgreSQL's detail does.
DROP TRIGGER bookings_no_overlap_insert;
DROP TRIGGER bookings_no_overlap_update;

CREATE TRIGGER bookings_no_overlap_insert
BEFORE INSERT ON bookings
FOR EACH ROW
WHEN EXISTS (
    SELECT 1 FROM bookings b
    WHERE b.atom = NEW.atom
      AND b.ends_at > NEW.starts_at
      AND b.starts_at < NEW.ends_at
      AND b.id <> NEW.id
)
BEGIN
    SELECT RAISE(ABORT, 'bookings_no_overlap: atom ' || NEW.atom);
END;

CREATE TRIGGER bookings_no_overlap_update
BEFORE UPDATE OF atom, starts_at, ends_at ON bookings
FOR EACH ROW
WHEN EXISTS (
    SELECT 1 FROM bookings b
    WHERE b.atom = NEW.atom
      AND b.ends_at > NEW.starts_at
      AND b.starts_at < NEW.ends_at
      AND b.id <> NEW.id
)
BEGIN
    SELECT RAISE(ABORT, 'bookings_no_overlap: atom ' || NEW.atom);
END;

CREATE TRIGGER cpu_bookings_no_overlap_insert
BEFORE INSERT ON cpu_bookings
FOR EACH ROW
WHEN EXISTS (
    SELECT 1 FROM cpu_bookings c
    WHERE c.node_id = NEW.node_id
      AND c.ends_at > NEW.starts_at
      AND c.starts_at < NEW.ends_at
      AND c.cpu_lo < NEW.cpu_hi
      AND c.cpu_hi > NEW.cpu_lo
      AND c.id <> NEW.id
)
BEGIN
    SELECT RAISE(ABORT, 'cpu_bookings_no_overlap: node ' || NEW.node_id);
END;

CREATE TRIGGER cpu_bookings_no_overlap_update
BEFORE UPDATE OF node_id, cpu_lo, cpu_hi, starts_at, ends_at ON cpu_bookings
FOR EACH ROW
WHEN EXISTS (
    SELECT 1 FROM cpu_bookings c
    WHERE c.node_id = NEW.node_id
      AND c.ends_at > NEW.starts_at
      AND c.starts_at < NEW.ends_at
      AND c.cpu_lo < NEW.cpu_hi
      AND c.cpu_hi > NEW.cpu_lo
      AND c.id <> NEW.id
)
BEGIN
    SELECT RAISE(ABORT, 'cpu_bookings_no_overlap: node ' || NEW.node_id);
END;

-- Ended bookings move here (Archive), out of the triggers' and the indexes'
-- way. Same columns, no constraints: rows are history, never booked against.
CREATE TABLE bookings_archive (
    id             TEXT NOT NULL,
    reservation_id TEXT NOT NULL,
    atom           TEXT NOT NULL,
    starts_at      TIMESTAMP NOT NULL,
    ends_at        TIMESTAMP NOT NULL,
    create_time    TIMESTAMP NOT NULL
);
CREATE INDEX bookings_archive_reservation ON bookings_archive (reservation_id);

CREATE TABLE cpu_bookings_archive (
    id             TEXT NOT NULL,
    reservation_id TEXT NOT NULL,
    node_id        TEXT NOT NULL,
    cpu_lo         INTEGER NOT NULL,
    cpu_hi         INTEGER NOT NULL,
    starts_at      TIMESTAMP NOT NULL,
    ends_at        TIMESTAMP NOT NULL,
    create_time    TIMESTAMP NOT NULL
);
CREATE INDEX cpu_bookings_archive_reservation ON cpu_bookings_archive (reservation_id);
