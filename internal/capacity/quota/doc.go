// Package quota owns the quotas table, the QuotaService API and the quota
// check every booking makes: a tenant, or one of its projects, may hold at
// most so many GPUs at once and book at most so many GPU-hours in all,
// optionally counted for one GPU model or one pool.
//
// Usage is never stored: it is computed from the reservations table when a
// booking is checked (Check, inside the booking's transaction, locking the
// quota rows so concurrent bookings of one scope serialize) or a quota is
// read. The package must never write reservations, place anything or decide
// access itself: every API call goes through the envelope.
package quota
