package reservation

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/better-compute/better-compute/internal/store"
)

// nodeCapabilities reads what a node's bcd advertised in its latest Hello.
func nodeCapabilities(ctx context.Context, q store.Querier, nodeID string) ([]string, error) {
	var raw string
	if err := q.QueryRow(ctx, `SELECT capabilities FROM nodes WHERE id = $1`, nodeID).Scan(&raw); err != nil {
		return nil, err
	}
	var caps []string
	if raw == "" {
		return nil, nil
	}
	if err := json.Unmarshal([]byte(raw), &caps); err != nil {
		return nil, fmt.Errorf("node %s capabilities: %w", nodeID, err)
	}
	return caps, nil
}
