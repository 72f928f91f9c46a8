package gateway_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// TestSessionReplacedThenReleased walks a session's opening and closing,
// which run apart from its loop: a newer session of the node ends the
// older one with ABORTED and keeps the owner; when the newer one ends, the
// owner is released; a command written afterwards reaches a third session.
func TestSessionReplacedThenReleased(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "replace-01")
	a.join(tok)
	owner := func() string {
		var o string
		query(t, f.cp.App.DB, `SELECT session_owner FROM nodes WHERE id = $1`, []any{a.nodeID}, &o)
		return o
	}

	first := a.session(0, "")
	second := a.session(0, "")
	st := first.closed()
	require.Equal(t, codes.Aborted, st.Code(), st.Message())
	require.Contains(t, st.Message(), "replaced")
	require.Equal(t, f.cp.App.Gateway.ReplicaID(), owner(), "the replaced session does not release its successor")
	require.True(t, f.cp.App.Gateway.Connected(a.nodeID))

	second.cancel()
	eventually(t, func() bool { return owner() == "" }, "owner released when the last session ends")
	eventually(t, func() bool { return !f.cp.App.Gateway.Connected(a.nodeID) }, "session gone from the hub")

	third := a.session(0, "")
	require.Equal(t, f.cp.App.Gateway.ReplicaID(), owner())
	run, err := f.cp.Admin().Commands.Run(context.Background(), connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: a.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	require.Equal(t, run.Msg.GetCommand().GetId(), third.nextCommand().GetId())
}
