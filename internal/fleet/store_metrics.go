package fleet

// SQL for the control plane's metrics: fleet-wide counts read at scrape
// time, each one bounded query.

import (
	"context"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// NodeCount is how many nodes are in one state and liveness, and how many of
// them have a session open with some gateway replica.
type NodeCount struct {
	State     string
	Liveness  string
	Nodes     int
	Connected int
}

// NodeCounts counts nodes by state and liveness (retired nodes included:
// they are a state like any other).
func NodeCounts(ctx context.Context, q store.Querier) ([]NodeCount, error) {
	rows, err := q.Query(ctx, `SELECT state, liveness, COUNT(*),
			COALESCE(SUM(CASE WHEN session_owner <> '' THEN 1 ELSE 0 END), 0)
		FROM nodes GROUP BY state, liveness ORDER BY state, liveness`)
	if err != nil {
		return nil, fmt.Errorf("count nodes: %w", err)
	}
	defer rows.Close()
	var out []NodeCount
	for rows.Next() {
		var (
			c            NodeCount
			n, connected int64
		)
		if err := rows.Scan(&c.State, &c.Liveness, &n, &connected); err != nil {
			return nil, fmt.Errorf("count nodes: %w", err)
		}
		c.Nodes, c.Connected = int(n), int(connected)
		out = append(out, c)
	}
	return out, rows.Err()
}

// NodeBeat is a node's last heartbeat as the metrics export it.
type NodeBeat struct {
	ID            string
	Name          string
	Liveness      string
	Connected     bool
	LastHeartbeat *time.Time
}

// NodeBeats returns the last heartbeat of up to limit nodes that are not
// retired, in id order; more reports whether nodes were left out.
func NodeBeats(ctx context.Context, q store.Querier, limit int) (beats []NodeBeat, more bool, err error) {
	rows, err := q.Query(ctx, `SELECT id, name, liveness, session_owner, last_heartbeat FROM nodes
		WHERE state <> 'retired' ORDER BY id LIMIT $1`, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("read heartbeats: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			b     NodeBeat
			owner string
		)
		if err := rows.Scan(&b.ID, &b.Name, &b.Liveness, &owner, &b.LastHeartbeat); err != nil {
			return nil, false, fmt.Errorf("read heartbeats: %w", err)
		}
		b.Connected = owner != ""
		beats = append(beats, b)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("read heartbeats: %w", err)
	}
	if len(beats) > limit {
		return beats[:limit], true, nil
	}
	return beats, false, nil
}

// CommandCount is how many commands of one kind are in one open state.
type CommandCount struct {
	Kind  string
	State string
	Count int
}

// OpenCommandCounts counts the commands not yet finished (pending,
// delivered, accepted, running) by kind and state. The commands_deadline
// index leads with state, so finished history is not scanned.
func OpenCommandCounts(ctx context.Context, q store.Querier) ([]CommandCount, error) {
	rows, err := q.Query(ctx, `SELECT kind, state, COUNT(*) FROM commands
		WHERE state IN ('pending', 'delivered', 'accepted', 'running')
		GROUP BY kind, state ORDER BY kind, state`)
	if err != nil {
		return nil, fmt.Errorf("count open commands: %w", err)
	}
	defer rows.Close()
	var out []CommandCount
	for rows.Next() {
		var (
			c CommandCount
			n int64
		)
		if err := rows.Scan(&c.Kind, &c.State, &n); err != nil {
			return nil, fmt.Errorf("count open commands: %w", err)
		}
		c.Count = int(n)
		out = append(out, c)
	}
	return out, rows.Err()
}
