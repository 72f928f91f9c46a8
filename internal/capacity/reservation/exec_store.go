package reservation

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// nodeCapabilities reads what a node's bcd advertised in its latest Hello.
func nodeCapabilities(ctx context.Context, q store.Querier, nodeID string) ([]string, error) {
	n, err := fleet.NodeStatusGet(ctx, q, nodeID)
	if err != nil {
		return nil, err
	}
	raw := n.Capabilities
	var caps []string
	if raw == "" {
		return nil, nil
	}
	if err := json.Unmarshal([]byte(raw), &caps); err != nil {
		return nil, fmt.Errorf("node %s capabilities: %w", nodeID, err)
	}
	return caps, nil
}
