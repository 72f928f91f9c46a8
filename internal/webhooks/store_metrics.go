package webhooks

// SQL for the control plane's metrics, read at scrape time.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// EndpointCount is how many endpoints are in one state, and how many of
// them are failing (a delivery is being retried).
type EndpointCount struct {
	State     string
	Endpoints int
	Failing   int
}

// EndpointCounts counts webhook endpoints by state, across tenants.
func EndpointCounts(ctx context.Context, q store.Querier) ([]EndpointCount, error) {
	rows, err := q.Query(ctx, `SELECT state, COUNT(*),
			COALESCE(SUM(CASE WHEN failing_since IS NOT NULL THEN 1 ELSE 0 END), 0)
		FROM webhooks GROUP BY state ORDER BY state`)
	if err != nil {
		return nil, fmt.Errorf("count webhook endpoints: %w", err)
	}
	defer rows.Close()
	var out []EndpointCount
	for rows.Next() {
		var (
			c          EndpointCount
			n, failing int64
		)
		if err := rows.Scan(&c.State, &n, &failing); err != nil {
			return nil, fmt.Errorf("count webhook endpoints: %w", err)
		}
		c.Endpoints, c.Failing = int(n), int(failing)
		out = append(out, c)
	}
	return out, rows.Err()
}

// DeliveryBacklog is what waits to be delivered and what was given up on.
type DeliveryBacklog struct {
	Pending int
	Dead    int
	// OldestPending is when the oldest pending delivery was queued; nil
	// when none is pending.
	OldestPending *time.Time
}

// DeliveryBacklogGet counts pending and dead-lettered deliveries and finds
// the oldest pending one. Succeeded deliveries, the bulk of the table, are
// not counted.
func DeliveryBacklogGet(ctx context.Context, q store.Querier) (DeliveryBacklog, error) {
	var b DeliveryBacklog
	rows, err := q.Query(ctx, `SELECT state, COUNT(*) FROM webhook_deliveries
		WHERE state IN ('pending', 'dead') GROUP BY state`)
	if err != nil {
		return b, fmt.Errorf("count webhook deliveries: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			state string
			n     int64
		)
		if err := rows.Scan(&state, &n); err != nil {
			return b, fmt.Errorf("count webhook deliveries: %w", err)
		}
		if state == DeliveryDead {
			b.Dead = int(n)
		} else {
			b.Pending = int(n)
		}
	}
	if err := rows.Err(); err != nil {
		return b, fmt.Errorf("count webhook deliveries: %w", err)
	}
	if b.Pending == 0 {
		return b, nil
	}
	// seq orders deliveries as they were queued, so the lowest pending seq
	// is the oldest; reading create_time itself keeps its column type.
	var oldest time.Time
	err = q.QueryRow(ctx, `SELECT create_time FROM webhook_deliveries WHERE state = 'pending' ORDER BY seq LIMIT 1`).Scan(&oldest)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return b, fmt.Errorf("oldest pending webhook delivery: %w", err)
	default:
		b.OldestPending = &oldest
	}
	return b, nil
}
