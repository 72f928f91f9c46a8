package gateway_test

import (
	"context"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/better-compute/better-compute/bctest"
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

// TestNodeMovesToLiveReplica: bcd given two gateways holds its session on
// the first; when that replica is killed the node's session comes up on
// the other, which becomes its session owner and delivers its commands.
func TestNodeMovesToLiveReplica(t *testing.T) {
	t.Parallel()
	f := setup(t)
	if !f.cp.App.DB.SupportsListener() {
		t.Skip("two replicas need PostgreSQL; set BC_TEST_POSTGRES_URL")
	}
	ctx := context.Background()
	r2 := f.cp.NewReplica(t)
	_, tok := f.token(t, nil)
	d, err := bctest.NewFakeDaemon(bctest.FakeDaemonConfig{Gateway: r2.GatewayAddr + "," + f.cp.GatewayAddr, StateDir: filepath.Join(t.TempDir(), "node")})
	require.NoError(t, err)
	require.NoError(t, d.Join(ctx, tok))
	d.Start()
	t.Cleanup(func() { _ = d.Stop() })
	owner := func() string {
		var o string
		query(t, f.cp.App.DB, `SELECT session_owner FROM nodes WHERE id = $1`, []any{d.NodeID()}, &o)
		return o
	}
	eventually(t, func() bool { return owner() == r2.App.Gateway.ReplicaID() }, "the session on the first replica listed")

	r2.Kill(t)
	eventually(t, func() bool { return owner() == f.cp.App.Gateway.ReplicaID() }, "the session on the live replica")
	// The owner is written when the gateway takes the Hello; bcd counts
	// the session established when the answer arrives.
	eventually(t, func() bool { return d.Gateway() == f.cp.GatewayAddr }, "bcd's session on the live replica")
	run, err := f.cp.Admin().Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: d.NodeID(), Kind: "inventory.refresh"}))
	require.NoError(t, err)
	eventually(t, func() bool {
		got, err := f.cp.Admin().Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Tenant: "acme", Id: run.Msg.GetCommand().GetId()}))
		require.NoError(t, err)
		return got.Msg.GetCommand().GetState() == "succeeded"
	}, "the command applied through the live replica")
}
