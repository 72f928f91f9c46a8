package gateway

import (
	"context"
	"errors"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// errGoodbye ends a session the agent closed on purpose; the stream ends
// with OK.
var errGoodbye = errors.New("the agent said goodbye")

// goodbye acts on an agent leaving on purpose (bcd stopping): its node is
// unreachable now — event node.unreachable with reason "goodbye" — not
// after UnreachableAfter without heartbeats, and this replica lets go of
// the session. A dropped session says nothing and keeps the timeout.
func (s *session) goodbye(m *agentv1.Goodbye) error {
	g := s.g
	err := g.cfg.DB.Write(s.ctx, func(ctx context.Context, tx store.Tx) error {
		refs, err := fleet.NodeRecordGoodbye(ctx, tx, s.nodeID, g.cfg.ReplicaID)
		if err != nil {
			return err
		}
		if err := g.stateChanged(ctx, tx, refs); err != nil {
			return err
		}
		return g.nodeEvents(ctx, tx, "node.unreachable", refs, map[string]any{"reason": "goodbye", "agent_reason": m.GetReason()})
	})
	if err != nil {
		return err
	}
	s.log.Info("session closed by the agent with a goodbye; node unreachable", "reason", m.GetReason())
	return errGoodbye
}
