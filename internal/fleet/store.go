package fleet

// The fleet's store: every SQL statement over its tables, split by table
// into store_nodes.go (nodes, node_conditions), store_join.go (join_tokens,
// join_requests), store_commands.go (commands) and store_inventory.go
// (gpus, mig_instances, nvlinks, numa_nodes, node_resources,
// inventory_sections, inventory_snapshots). The API handlers and the agent
// gateway share these functions; each is named Noun+Verb after its table.
// Time is read only through compute_now() or a caller's clock.

import (
	"context"
	"embed"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("fleet", migrationsFS)
}

// Id prefixes of the fleet's rows (envelope.NewID).
const (
	NodeIDPrefix        = "nod"
	CommandIDPrefix     = "cmd"
	JoinTokenIDPrefix   = "jtk"
	JoinRequestIDPrefix = "jrq"
)

// scanner is a Row or the current row of Rows.
type scanner interface{ Scan(...any) error }

// collect scans every row of a query with scan.
func collect[T any](rows store.Rows, err error, scan func(scanner) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// queryEach runs a query and calls fn for every row.
func queryEach(ctx context.Context, q store.Querier, query string, args []any, fn func(store.Rows) error) error {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// placeholders appends values to args and returns their "$n, $m" list.
func placeholders(args *[]any, values []string) string {
	ps := make([]string, len(values))
	for i, v := range values {
		*args = append(*args, v)
		ps[i] = "$" + strconv.Itoa(len(*args))
	}
	return strings.Join(ps, ", ")
}

// inBatch is how many ids one statement binds.
const inBatch = 500

// chunks splits ids into runs of at most inBatch.
func chunks(ids []string) [][]string {
	var out [][]string
	for len(ids) > 0 {
		n := min(len(ids), inBatch)
		out = append(out, ids[:n])
		ids = ids[n:]
	}
	return out
}

// ago is SQL for "compute_now() minus d" in dialect d, with the duration
// bound as parameter $n (agoArg). On SQLite the shifted time is rebuilt in
// the store's fixed-width text format (strftime keeps milliseconds; the
// microsecond digits come from compute_now() itself, which a
// whole-millisecond shift leaves unchanged), so text comparison with stored
// times stays exact.
func ago(d store.Dialect, n int) string {
	p := "$" + strconv.Itoa(n)
	if d == store.Postgres {
		return "(compute_now() - make_interval(secs => " + p + "))"
	}
	return "(strftime('%Y-%m-%dT%H:%M:%f', compute_now(), " + p + ") || substr(compute_now(), 24))"
}

// agoArg is the parameter ago expects for d.
func agoArg(d store.Dialect, dur time.Duration) any {
	ms := dur.Milliseconds()
	if d == store.Postgres {
		return float64(ms) / 1000
	}
	return fmt.Sprintf("-%d.%03d seconds", ms/1000, ms%1000)
}

// i64 converts an unsigned count for binding; the database stores BIGINT.
func i64(v uint64) int64 { return int64(min(v, math.MaxInt64)) }
