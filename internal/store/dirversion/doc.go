// Package dirversion lets a request serve the directory — API keys,
// tenants, projects, pools with their offers and policies — from memory
// without ever answering from a copy older than what is committed when the
// request began, on any replica.
//
// The directory has one version: a counter (the "directory" row of the
// store's store_versions table) that every write to api_keys, tenants,
// projects, pools or pool_offers moves on with Bump, inside the transaction
// that changes the row. The API interceptor reads it once per unary request
// (Directory.Begin: one primary-key read) and carries it in the context; a
// Cache answers only with entries stamped with that same version, and a
// request that sees another version drops every cached entry first. So a key
// revoked, a project deleted or an offer withdrawn on one replica is seen by
// the next request on every replica, with no message to deliver and no TTL.
//
// Why a counter of its own and not the outbox: the events table's sequence
// moves with every reservation, so a cache keyed on it would be dropped by
// every create, and on PostgreSQL an event's number is not in commit order
// (visibility comes from the transaction id and the snapshot horizon), so
// "the newest number" is not one cheap read. Why one counter for the whole
// directory and not one per table: these writes are rare (administration,
// not the booking path), dropping every entry on any of them costs a few
// reads, and one row gives writers one lock to take in one order (a writer
// bumps before it changes a row, so two writers of several directory rows
// cannot deadlock on the counter) and readers one read. Why here, under
// internal/store: the counter must exist in every database any of its four
// writers is migrated into (tests migrate subsets of modules), which the
// store's core migrations guarantee; and a package of the store layer may be
// imported by the envelope, which reads it, and by the modules, which bump
// it, without a new dependency between them.
//
// It must never serve an entry without a version from the request's context
// (a background job, a stream, a caller outside the interceptor reads the
// database), never cache what was read before the request's version, and
// never hold an entry across a version change. A writer that changes a
// directory row without Bump (a hand edit of the database) is seen only
// after the next Bump.
package dirversion
