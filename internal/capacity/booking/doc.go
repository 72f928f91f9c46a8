// Package booking owns bookings: one atom of a node's capacity (a GPU by its
// UUID, a MIG slice "<uuid>/mig/1g.10gb/0", an MPS share "<uuid>/s3", a vCPU
// "<node-id>/vcpu/17") held over a half-open time range [starts_at, ends_at)
// for a reservation.
//
// Two bookings of one atom never overlap in time, and the database, not this
// package, guarantees it: on PostgreSQL an EXCLUDE USING gist constraint
// (btree_gist) named bookings_no_overlap, on SQLite BEFORE INSERT/UPDATE
// triggers that RAISE(ABORT, 'bookings_no_overlap'), which is correct because
// SQLite has one writer. Code here never checks and then inserts; it writes
// and maps the constraint's refusal to ErrOverlap.
package booking
