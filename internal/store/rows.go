package store

import (
	"context"
	"math/bits"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// maxParams is the most bind parameters one statement carries: under
// SQLite's 32,766 and PostgreSQL's 65,535.
const maxParams = 30000

// maxParamsSQLite is the most one statement carries on SQLite. Its
// parameters are anonymous ("?"): SQLite looks a named one ("$7") up in a
// list as long as the statement's parameters each time it is bound, which
// made binding cost the square of their number — 2,000 rows of five values
// in one statement took 347 ms with "$n" parameters. With "?" binding is
// linear, and fewer, larger statements parse and step less often
// (BenchmarkInsertRows).
const maxParamsSQLite = 1000

// InsertRows writes rows with as few multi-row INSERT statements as the
// parameter limit allows: head is "INSERT INTO t (a, b, c)", tail what
// follows the VALUES list (an ON CONFLICT clause, or ""). Every row has the
// same number of values; a value that is a Raw is written into the SQL as it
// is (compute_now(), say) instead of as a parameter. On PostgreSQL a large
// set of rows with no tail and no Raw goes by COPY instead.
func InsertRows(ctx context.Context, tx Tx, head, tail string, rows [][]any) error {
	if len(rows) == 0 {
		return nil
	}
	if len(rows) >= copyMinRows && tail == "" && tx.Dialect() == Postgres {
		if ok, err := copyInsert(ctx, tx, head, rows); ok || err != nil {
			return err
		}
	}
	limit, anonymous := maxParams, false
	if tx.Dialect() == SQLite {
		// "?" only where the tail names no parameter of its own: SQLite
		// numbers a "?" after the highest number used before it.
		limit, anonymous = maxParamsSQLite, !strings.Contains(tail, "$")
	}
	per := max(1, limit/max(1, len(rows[0])))
	for len(rows) > 0 {
		// Full statements, then the rest in powers of two: a table's
		// inserts come in a handful of shapes, each parsed once and then
		// run prepared (see the SQLite store's statement cache), whatever
		// the batch's size.
		n := per
		if len(rows) < per {
			n = 1 << (bits.Len(uint(len(rows))) - 1)
		}
		q, args := valuesSQL(head, tail, rows[:n], anonymous)
		if _, err := tx.Exec(ctx, q, args...); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// copyMinRows is the fewest rows InsertRows writes with COPY on
// PostgreSQL: below it a prepared INSERT is as cheap, and one round trip
// rather than COPY's two.
const copyMinRows = 64

var insertHead = regexp.MustCompile(`^INSERT INTO ([a-z_][a-z0-9_]*) \(([a-z0-9_, ]+)\)$`)

// copyInsert writes rows with COPY when head is a plain INSERT and no value
// is Raw but compute_now(), which it reads once and writes as a value; ok
// is false, with nothing written, when it cannot.
func copyInsert(ctx context.Context, q Tx, head string, rows [][]any) (ok bool, err error) {
	t, isTx := q.(*tx)
	m := insertHead.FindStringSubmatch(head)
	if !isTx || m == nil {
		return false, nil
	}
	hasNow := false
	for _, row := range rows {
		for _, v := range row {
			if raw, isRaw := v.(Raw); isRaw {
				if raw != "compute_now()" {
					return false, nil
				}
				hasNow = true
			}
		}
	}
	if hasNow {
		now, err := t.computeNow(ctx)
		if err != nil {
			return true, err
		}
		// The caller's rows stay as they were: copies with the value.
		out := make([][]any, len(rows))
		for i, row := range rows {
			cloned := false
			for j, v := range row {
				if _, isRaw := v.(Raw); isRaw {
					if !cloned {
						row, cloned = slices.Clone(row), true
					}
					row[j] = now
				}
			}
			out[i] = row
		}
		rows = out
	}
	cols := strings.Split(m[2], ",")
	for i := range cols {
		cols[i] = strings.TrimSpace(cols[i])
	}
	return t.copyRows(ctx, m[1], cols, rows)
}

// Raw is SQL written into an InsertRows statement in place of a parameter.
type Raw string

// valuesSQL is the statement and its arguments: parameters are "$n", or
// "?" when anonymous (SQLite only; PostgreSQL knows no "?").
func valuesSQL(head, tail string, rows [][]any, anonymous bool) (string, []any) {
	var b strings.Builder
	args := make([]any, 0, len(rows)*len(rows[0]))
	b.Grow(len(head) + len(tail) + len(rows)*len(rows[0])*6)
	b.WriteString(head)
	b.WriteString(" VALUES ")
	for i, row := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for j, v := range row {
			if j > 0 {
				b.WriteString(", ")
			}
			if raw, ok := v.(Raw); ok {
				b.WriteString(string(raw))
				continue
			}
			args = append(args, v)
			if anonymous {
				b.WriteByte('?')
				continue
			}
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(len(args)))
		}
		b.WriteByte(')')
	}
	if tail != "" {
		b.WriteByte(' ')
		b.WriteString(tail)
	}
	return b.String(), args
}

// ForUpdate is the row-lock clause of a SELECT that a writer must hold until
// it commits: " FOR UPDATE" on PostgreSQL, nothing on SQLite, whose one
// writer already excludes every other.
func ForUpdate(tx Tx) string { return lockClause(tx, " FOR UPDATE") }

// ForShare is the shared row-lock clause (" FOR SHARE" on PostgreSQL): the
// row may not change until the reader commits, other readers still may.
func ForShare(tx Tx) string { return lockClause(tx, " FOR SHARE") }

// ForNoKeyUpdate is the clause of a writer that changes what hangs off a row
// (not its key): it waits for, and makes wait, every FOR SHARE reader of the
// row (" FOR NO KEY UPDATE" on PostgreSQL).
func ForNoKeyUpdate(tx Tx) string { return lockClause(tx, " FOR NO KEY UPDATE") }

func lockClause(tx Tx, clause string) string {
	if tx.Dialect() == Postgres {
		return clause
	}
	return ""
}

// Strings reads a one-column result of strings (call it with what Query
// returned) and closes the rows.
func Strings(rows Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
