package gateway_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// TestCrossReplica: a command written through one replica wakes the
// session another replica holds (LISTEN/NOTIFY), and a session opened on
// one replica replaces the node's session on another.
func TestCrossReplica(t *testing.T) {
	t.Parallel()
	f := setup(t)
	if !f.cp.App.DB.SupportsListener() {
		t.Skip("replicas wake each other through LISTEN/NOTIFY, which SQLite lacks; set BC_TEST_POSTGRES_URL")
	}
	ctx := context.Background()
	r2 := f.cp.NewReplica(t)
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "x1")
	a.join(tok)

	a.addr = r2.GatewayAddr
	st := a.session(0, "")
	var owner string
	query(t, f.cp.App.DB, `SELECT session_owner FROM nodes WHERE id = $1`, []any{a.nodeID}, &owner)
	require.Equal(t, r2.App.Gateway.ReplicaID(), owner)

	run, err := f.cp.Admin().Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: a.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	c := st.nextCommand()
	require.Equal(t, run.Msg.GetCommand().GetId(), c.GetId())

	a.addr = ""
	a.session(0, "")
	require.Equal(t, codes.Aborted, st.closed().Code())
	query(t, f.cp.App.DB, `SELECT session_owner FROM nodes WHERE id = $1`, []any{a.nodeID}, &owner)
	require.Equal(t, f.cp.App.Gateway.ReplicaID(), owner)
}
