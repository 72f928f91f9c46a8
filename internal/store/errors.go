package store

import (
	"errors"
	"strings"
)

// Domain errors. Driver errors are classified into these at the store
// boundary, so modules never look at SQLSTATEs or SQLite result codes.
var (
	// ErrNotFound: a single-row query returned no row.
	ErrNotFound = errors.New("not found")
	// ErrUnique: a unique or primary-key constraint was violated.
	ErrUnique = errors.New("unique violation")
	// ErrConstraint: an exclusion, check, foreign-key or NOT NULL constraint,
	// or a trigger's RAISE(ABORT)/RAISE EXCEPTION, refused the change.
	ErrConstraint = errors.New("constraint violation")
	// ErrSerialization: the transaction conflicted with another (or, on
	// SQLite, the database stayed locked); rerunning it may succeed.
	ErrSerialization = errors.New("serialization failure")
	// ErrLockTimeout: a statement waited for a lock longer than the
	// connection's lock_timeout (another transaction held it); nothing was
	// changed, and rerunning later may succeed.
	ErrLockTimeout = errors.New("lock wait timed out")
	// ErrStatementTimeout: a statement ran longer than the connection's
	// statement_timeout and was cancelled; nothing was changed.
	ErrStatementTimeout = errors.New("statement timed out")
	// ErrSchemaTooNew: the database was migrated by a newer binary.
	ErrSchemaTooNew = errors.New("schema too new")
)

// Error is a classified driver error.
type Error struct {
	// Kind is one of the Err* sentinels above.
	Kind error
	// Constraint is the constraint or index name when the driver gives one
	// (on SQLite the "t.col" list of a UNIQUE failure, or a CHECK's name).
	Constraint string
	// Err is the driver's error.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Kind.Error())
	if e.Constraint != "" {
		b.WriteString(" on ")
		b.WriteString(e.Constraint)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap lets errors.Is match both the Kind and the driver error.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

// ConstraintOf returns the constraint name of a classified error, or "".
func ConstraintOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Constraint
	}
	return ""
}
