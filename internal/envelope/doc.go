// Package envelope is the one pipeline every API call passes: authenticate →
// validate → build the draft resource → exactly one authorization decision →
// one transaction (rows, one audit row, outbox events, jobs) → response. It
// also owns the service catalog, idempotent replay of creates, the read
// decision cache, confirmations, and the mapping of errors to stable machine
// codes.
//
// It must never decide twice for one mutation, write outside the mutation's
// transaction, or let a handler reach the database before the decision.
package envelope
