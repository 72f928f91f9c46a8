package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// tx adapts *sql.Tx to store.DriverTx, converting times to and from the one
// text format (store.SQLiteTimeLayout) at this boundary, so module code binds
// and scans time.Time on both dialects alike.
type tx struct {
	tx    *sql.Tx
	cache *stmtCache
}

func (t *tx) Raw() any { return t.tx }

func (t *tx) Commit(ctx context.Context) error {
	err := t.tx.Commit()
	t.cache.flush(context.WithoutCancel(ctx))
	return err
}

func (t *tx) Rollback(ctx context.Context) error {
	err := t.tx.Rollback()
	t.cache.flush(context.WithoutCancel(ctx))
	return err
}

// stmt returns the transaction's handle on query's prepared statement, or
// nil when it is not prepared yet.
func (t *tx) stmt(ctx context.Context, query string) *sql.Stmt {
	if s := t.cache.get(query); s != nil {
		return t.tx.StmtContext(ctx, s)
	}
	return nil
}

func (t *tx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	var res sql.Result
	var err error
	if s := t.stmt(ctx, query); s != nil {
		res, err = s.ExecContext(ctx, convertArgs(args)...)
	} else {
		res, err = t.tx.ExecContext(ctx, query, convertArgs(args)...)
	}
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (t *tx) Query(ctx context.Context, query string, args ...any) (store.Rows, error) {
	var r *sql.Rows
	var err error
	if s := t.stmt(ctx, query); s != nil {
		r, err = s.QueryContext(ctx, convertArgs(args)...)
	} else {
		r, err = t.tx.QueryContext(ctx, query, convertArgs(args)...)
	}
	if err != nil {
		return nil, err
	}
	return rows{r}, nil
}

func (t *tx) QueryRow(ctx context.Context, query string, args ...any) store.Row {
	if s := t.stmt(ctx, query); s != nil {
		return row{s.QueryRowContext(ctx, convertArgs(args)...)}
	}
	return row{t.tx.QueryRowContext(ctx, query, convertArgs(args)...)}
}

type rows struct{ r *sql.Rows }

func (r rows) Next() bool             { return r.r.Next() }
func (r rows) Err() error             { return r.r.Err() }
func (r rows) Close() error           { return r.r.Close() }
func (r rows) Scan(dest ...any) error { return scan(r.r.Scan, dest) }

type row struct{ r *sql.Row }

func (r row) Scan(dest ...any) error { return scan(r.r.Scan, dest) }

// FormatTime renders t the way every timestamp is stored on SQLite.
func FormatTime(t time.Time) string { return t.UTC().Format(store.SQLiteTimeLayout) }

func convertArgs(args []any) []any {
	var out []any
	for i, a := range args {
		var v any
		switch a := a.(type) {
		case time.Time:
			v = FormatTime(a)
		case *time.Time:
			if a == nil {
				v = nil
			} else {
				v = FormatTime(*a)
			}
		case sql.NullTime:
			if a.Valid {
				v = FormatTime(a.Time)
			} else {
				v = nil
			}
		default:
			if out != nil {
				out[i] = a
			}
			continue
		}
		if out == nil {
			out = make([]any, len(args))
			copy(out, args)
		}
		out[i] = v
	}
	if out == nil {
		return args
	}
	return out
}

// scan reads time destinations through an untyped value, because the
// source is text (TEXT columns, compute_now()) or a time.Time the driver
// parsed itself (TIMESTAMP columns).
func scan(scanFn func(...any) error, dest []any) error {
	var fix []int
	tmp := dest
	for i, d := range dest {
		switch d.(type) {
		case *time.Time, **time.Time, *sql.NullTime:
			if fix == nil {
				tmp = make([]any, len(dest))
				copy(tmp, dest)
			}
			fix = append(fix, i)
			tmp[i] = new(any)
		}
	}
	if err := scanFn(tmp...); err != nil {
		return err
	}
	for _, i := range fix {
		src := *(tmp[i].(*any))
		var t time.Time
		valid := src != nil
		if valid {
			var err error
			if t, err = parseTime(src); err != nil {
				return fmt.Errorf("scan column %d: %w", i, err)
			}
		}
		switch d := dest[i].(type) {
		case *time.Time:
			if !valid {
				return fmt.Errorf("scan column %d: converting NULL to time.Time is unsupported", i)
			}
			*d = t
		case **time.Time:
			if !valid {
				*d = nil
			} else {
				*d = &t
			}
		case *sql.NullTime:
			*d = sql.NullTime{Time: t, Valid: valid}
		}
	}
	return nil
}

// parseLayouts are tried in order: ours first, then the ones the driver and
// other writers (River) may have used.
var parseLayouts = []string{
	store.SQLiteTimeLayout,
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02",
}

func parseTime(src any) (time.Time, error) {
	var s string
	switch v := src.(type) {
	case time.Time:
		return v.UTC(), nil
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return time.Time{}, fmt.Errorf("cannot convert %T to time.Time", src)
	}
	for _, layout := range parseLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("cannot parse %q as a time", s)
}
