// Package booking owns bookings: capacity of a node held over a half-open
// time range [starts_at, ends_at) for a reservation. A device atom (a GPU by
// its UUID, a MIG slice "<uuid>/mig/1g.10gb/0", an MPS share "<uuid>/s3") is
// one bookings row; a node's CPUs are one cpu_bookings row per contiguous
// range [cpu_lo, cpu_hi), not one row per CPU.
//
// Two bookings of one atom, or of one CPU of a node, never overlap in time,
// and the database, not this package, guarantees it: on PostgreSQL EXCLUDE
// USING gist constraints (btree_gist) named bookings_no_overlap and
// cpu_bookings_no_overlap, on SQLite BEFORE INSERT/UPDATE triggers that
// RAISE(ABORT) with the same names, which is correct because SQLite has one
// writer. Code here never checks and then inserts; it writes and maps the
// constraint's refusal to ErrOverlap.
//
// Ended bookings move to bookings_archive and cpu_bookings_archive (Archive,
// run by a periodic job), so the live tables, their constraints and their
// indexes hold only what can still be booked against.
package booking
