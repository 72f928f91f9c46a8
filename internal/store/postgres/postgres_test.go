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
	}
	for _, tt := range tests {
		pe := &pgconn.PgError{Code: tt.code, ConstraintName: "c_" + tt.code}
		got := d.Classify(fmt.Errorf("exec: %w", pe))
		assert.ErrorIs(t, got, tt.want, tt.code)
		assert.ErrorIs(t, got, pe, "the driver error stays reachable")
		if !errors.Is(tt.want, store.ErrSerialization) {
			assert.Equal(t, "c_"+tt.code, store.ConstraintOf(got))
		}
	}
	assert.ErrorIs(t, d.Classify(pgx.ErrNoRows), store.ErrNotFound)
	other := errors.New("other")
	assert.Equal(t, other, d.Classify(other))
	unknown := &pgconn.PgError{Code: "42P01"}
	assert.Equal(t, error(unknown), d.Classify(unknown), "unknown SQLSTATEs pass through")
}
