// Package reporules holds the repository's rules as tests: every package
// has a doc comment, SQL reads time only through compute_now(), and imports
// keep the dependency direction cmd → app → modules → store/iam/clock.
//
// It has no code of its own and must never be imported.
package reporules
