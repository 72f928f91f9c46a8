package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConstraintName(t *testing.T) {
	t.Parallel()
	tests := []struct{ msg, want string }{
		{"constraint failed: UNIQUE constraint failed: t.col (2067)", "t.col"},
		{"UNIQUE constraint failed: t.a, t.b", "t.a, t.b"},
		{"constraint failed: CHECK constraint failed: positive (275)", "positive"},
		{"constraint failed: booking overlaps (1811)", "booking overlaps"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, constraintName(tt.msg), tt.msg)
	}
}

func TestTimeText(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.FixedZone("x", -3600))
	got := FormatTime(at)
	assert.Equal(t, "2026-01-02T04:04:05.000006Z", got)
	for _, src := range []any{got, []byte(got), at, "2026-01-02 04:04:05.000006+00:00"} {
		back, err := parseTime(src)
		require.NoError(t, err)
		assert.True(t, back.Equal(at), "%v", src)
		assert.Equal(t, time.UTC, back.Location())
	}
	_, err := parseTime(42)
	require.Error(t, err)
	_, err = parseTime("yesterday")
	require.Error(t, err)
}

func TestConvertArgs(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	in := []any{1, at, &at, (*time.Time)(nil), sql.NullTime{}, sql.NullTime{Time: at, Valid: true}, "x"}
	want := []any{1, FormatTime(at), FormatTime(at), nil, nil, FormatTime(at), "x"}
	assert.Equal(t, want, convertArgs(in))
	plain := []any{1, "x"}
	assert.Equal(t, plain, convertArgs(plain))
}

// A second opening of one database file (another process, or this one) is
// refused while the first holds it, naming the holder; it opens once the
// first closes.
func TestOpenRefusesASecondHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "bc.db")
	first, err := Open(ctx, Config{Path: path, Exclusive: true})
	require.NoError(t, err)
	// A tool that does not serve still opens it.
	tool, err := Open(ctx, Config{Path: path})
	require.NoError(t, err)
	require.NoError(t, tool.Close())
	_, err = Open(ctx, Config{Path: path, Exclusive: true})
	require.ErrorIs(t, err, ErrInUse)
	require.Contains(t, err.Error(), fmt.Sprintf("process %d holds", os.Getpid()))
	require.NoError(t, first.Close())
	second, err := Open(ctx, Config{Path: path, Exclusive: true})
	require.NoError(t, err)
	require.NoError(t, second.Close())
}
