package postgres

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"

	"github.com/better-compute/better-compute/internal/store"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	d := &Driver{}
	tests := []struct {
		code string
		want error
	}{
		{"23505", store.ErrUnique},
		{"23P01", store.ErrConstraint},
		{"23514", store.ErrConstraint},
		{"23503", store.ErrConstraint},
		{"P0001", store.ErrConstraint},
		{"40001", store.ErrSerialization},
		{"40P01", store.ErrSerialization},
		{"55P03", store.ErrLockTimeout},
	}
	for _, tt := range tests {
		pe := &pgconn.PgError{Code: tt.code, ConstraintName: "c_" + tt.code}
		got := d.Classify(fmt.Errorf("exec: %w", pe))
		assert.ErrorIs(t, got, tt.want, tt.code)
		assert.ErrorIs(t, got, pe, "the driver error stays reachable")
		if !errors.Is(tt.want, store.ErrSerialization) && !errors.Is(tt.want, store.ErrLockTimeout) {
			assert.Equal(t, "c_"+tt.code, store.ConstraintOf(got))
		}
	}
	assert.ErrorIs(t, d.Classify(pgx.ErrNoRows), store.ErrNotFound)
	other := errors.New("other")
	assert.Equal(t, other, d.Classify(other))
	// 57014 is a timeout only when statement_timeout cancelled it; a cancel
	// request (a caller gone) is not one.
	timedOut := &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}
	assert.ErrorIs(t, d.Classify(timedOut), store.ErrStatementTimeout)
	cancelled := &pgconn.PgError{Code: "57014", Message: "canceling statement due to user request"}
	assert.Equal(t, error(cancelled), d.Classify(cancelled))
	unknown := &pgconn.PgError{Code: "42P01"}
	assert.Equal(t, error(unknown), d.Classify(unknown), "unknown SQLSTATEs pass through")
}
