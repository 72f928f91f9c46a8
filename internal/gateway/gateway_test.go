package gateway_test

import (
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// TestRoundTrip: join → session → hello → heartbeat → command round trip →
// drain, with no authorization call on any fleet path.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.cp.Admin()
	_, tok := f.token(t, map[string]string{"rack": "r1"})

	f.cp.Authz.Reset()
	a := newAgent(t, f, "gpu-01")
	res := a.join(tok)
	require.True(t, strings.HasPrefix(res.GetNodeId(), "nod_"), res.GetNodeId())
	require.NotEmpty(t, res.GetTrustBundlePem())
	require.Equal(t, f.cp.PKI.TrustDomain(), res.GetTrustDomain())

	var name, pool, labels, tenant string
	query(t, f.cp.App.DB, `SELECT name, pool, labels, tenant_id FROM nodes WHERE id = $1`, []any{a.nodeID}, &name, &pool, &labels, &tenant)
	require.Equal(t, "gpu-01", name)
	require.Equal(t, "a100", pool)
	require.JSONEq(t, `{"rack":"r1"}`, labels)
	state, live := nodeState(t, f, a.nodeID)
	require.Equal(t, "joining/ready", state+"/"+live)
	require.Equal(t, 1, count(t, f, `SELECT count(*) FROM events WHERE type = 'node.joined' AND resource_id = $1`, a.nodeID))

	// A retry with the same token and CSR: same node, fresh certificate.
	first := res.GetCertificateChain()[0]
	again := a.join(tok)
	require.Equal(t, a.nodeID, again.GetNodeId())
	require.NotEqual(t, first, again.GetCertificateChain()[0])

	st := a.session(0, "")
	require.NotNil(t, st.next().GetInventoryRequest(), "no inventory held: the gateway asks for it")
	var owner string
	query(t, f.cp.App.DB, `SELECT session_owner FROM nodes WHERE id = $1`, []any{a.nodeID}, &owner)
	require.Equal(t, f.cp.App.Gateway.ReplicaID(), owner)
	state, live = nodeState(t, f, a.nodeID)
	require.Equal(t, "active/ready", state+"/"+live)

	// Heartbeats are batched: written at the flush, by compute_now().
	now := f.cp.Clock.Advance(5 * time.Second)
	st.send(heartbeat())
	eventually(t, func() bool {
		require.NoError(t, f.cp.App.Gateway.FlushHeartbeats(ctx))
		var hb time.Time
		query(t, f.cp.App.DB, `SELECT last_heartbeat FROM nodes WHERE id = $1`, []any{a.nodeID}, &hb)
		// PostgreSQL keeps microseconds (rounded), SQLite too (truncated).
		return hb.Sub(now).Abs() < time.Millisecond
	}, "heartbeat written")
	require.Zero(t, f.cp.Authz.Calls(), "join, session and heartbeats make no authorization call")

	// A command through the API reaches the agent at once.
	run, err := admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: a.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	apiCalls := f.cp.Authz.Calls()
	c := st.nextCommand()
	require.Equal(t, run.Msg.GetCommand().GetId(), c.GetId())
	require.Equal(t, uint64(1), c.GetSeq())
	require.Equal(t, "inventory.refresh", c.GetKind())
	// The gateway marks the command delivered right after sending it.
	eventually(t, func() bool {
		var cstate string
		query(t, f.cp.App.DB, `SELECT state FROM commands WHERE id = $1`, []any{c.GetId()}, &cstate)
		return cstate == "delivered"
	}, "command marked delivered")

	st.send(update(c, agentv1.CommandState_COMMAND_STATE_ACCEPTED, 0))
	st.send(update(c, agentv1.CommandState_COMMAND_STATE_RUNNING, 50))
	done := update(c, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, 100)
	done.GetCommandUpdate().Result, _ = structpb.NewStruct(map[string]any{"sections": 4.0})
	st.send(done)
	// A stale report after the end is ignored, not refused.
	st.send(update(c, agentv1.CommandState_COMMAND_STATE_RUNNING, 60))
	st.send(update(c, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, 100))
	eventually(t, func() bool {
		var cstate string
		query(t, f.cp.App.DB, `SELECT state FROM commands WHERE id = $1`, []any{c.GetId()}, &cstate)
		return cstate == "succeeded"
	}, "command succeeded")
	var result string
	var progress int
	query(t, f.cp.App.DB, `SELECT result, progress FROM commands WHERE id = $1`, []any{c.GetId()}, &result, &progress)
	require.JSONEq(t, `{"sections":4}`, result)
	require.Equal(t, 100, progress)
	require.Equal(t, 1, count(t, f, `SELECT count(*) FROM events WHERE type = 'command.succeeded' AND resource_id = $1`, c.GetId()))

	// Drain: node.drain SUCCEEDED moves the node to drained.
	dr, err := admin.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Tenant: "acme", Node: a.nodeID}))
	require.NoError(t, err)
	apiCalls = f.cp.Authz.Calls() - apiCalls + apiCalls
	dc := st.nextCommand()
	require.Equal(t, dr.Msg.GetCommand().GetId(), dc.GetId())
	require.Equal(t, "node.drain", dc.GetKind())
	require.Equal(t, uint64(2), dc.GetSeq())
	st.send(update(dc, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, 100))
	eventually(t, func() bool {
		state, _ := nodeState(t, f, a.nodeID)
		return state == "drained"
	}, "node drained")
	st.send(heartbeat())
	require.Equal(t, apiCalls, f.cp.Authz.Calls(), "command updates make no authorization call")
}

// TestRedeliveryAndCancel: commands are rows first: an open command is sent
// again after a reconnect, the newer session replaces the older, and a
// cancel reaches the agent.
func TestRedeliveryAndCancel(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.cp.Admin()
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "gpu-02")
	a.join(tok)
	st := a.session(0, "")
	run, err := admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: a.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	c := st.nextCommand()
	require.Equal(t, run.Msg.GetCommand().GetId(), c.GetId())
	st.send(update(c, agentv1.CommandState_COMMAND_STATE_ACCEPTED, 0))

	// Reconnect without having applied it: delivered again; the old
	// session ends ABORTED.
	st2 := a.session(0, "")
	require.Equal(t, codes.Aborted, st.closed().Code())
	again := st2.nextCommand()
	require.Equal(t, c.GetId(), again.GetId())
	require.Equal(t, c.GetSeq(), again.GetSeq())

	_, err = admin.Commands.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandRequest{Tenant: "acme", Id: c.GetId()}))
	require.NoError(t, err)
	for {
		m := st2.next()
		if cc := m.GetCancel(); cc != nil {
			require.Equal(t, c.GetId(), cc.GetCommandId())
			require.Equal(t, c.GetSeq(), cc.GetSeq())
			break
		}
	}
	// Reconnecting after seq 1 was applied: nothing is delivered again.
	st3 := a.session(1, "")
	require.Equal(t, codes.Aborted, st2.closed().Code())
	run2, err := admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: a.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	next := st3.nextCommand()
	require.Equal(t, run2.Msg.GetCommand().GetId(), next.GetId())
	require.Equal(t, uint64(2), next.GetSeq())
}

// TestLiveness: no heartbeat for UnreachableAfter → unreachable, for
// LostAfter → lost; a heartbeat makes the node ready at once.
func TestLiveness(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	gw := f.cp.App.Gateway
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "gpu-03")
	a.join(tok)
	st := a.session(0, "")

	f.cp.Clock.Advance(29 * time.Second)
	u, l, err := gw.SweepLiveness(ctx)
	require.NoError(t, err)
	require.Zero(t, u+l)

	f.cp.Clock.Advance(2 * time.Second)
	u, l, err = gw.SweepLiveness(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, u)
	require.Zero(t, l)
	_, live := nodeState(t, f, a.nodeID)
	require.Equal(t, "unreachable", live)
	u, _, err = gw.SweepLiveness(ctx)
	require.NoError(t, err)
	require.Zero(t, u, "level-triggered: a second sweep changes nothing")

	st.send(heartbeat())
	eventually(t, func() bool {
		require.NoError(t, gw.FlushHeartbeats(ctx))
		_, live := nodeState(t, f, a.nodeID)
		return live == "ready"
	}, "ready again")
	require.Equal(t, 1, count(t, f, `SELECT count(*) FROM events WHERE type = 'node.ready' AND resource_id = $1`, a.nodeID))
	require.Equal(t, 1, count(t, f, `SELECT count(*) FROM events WHERE type = 'node.unreachable' AND resource_id = $1`, a.nodeID))

	f.cp.Clock.Advance(5*time.Minute + time.Second)
	u, l, err = gw.SweepLiveness(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, l)
	_, live = nodeState(t, f, a.nodeID)
	require.Equal(t, "lost", live)
	require.Equal(t, 1, count(t, f, `SELECT count(*) FROM events WHERE type = 'node.lost' AND resource_id = $1`, a.nodeID))
	_ = u
}

// TestCommandSweep: an open command past its deadline expires and the agent
// is told to stop it.
func TestCommandSweep(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "gpu-04")
	a.join(tok)
	st := a.session(0, "")
	run, err := f.cp.Admin().Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{
		Tenant: "acme", Node: a.nodeID, Kind: "inventory.refresh", DeadlineSeconds: 60,
	}))
	require.NoError(t, err)
	c := st.nextCommand()
	require.Equal(t, run.Msg.GetCommand().GetId(), c.GetId())

	f.cp.Clock.Advance(61 * time.Second)
	n, err := f.cp.App.Gateway.SweepCommands(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, n, 1, "the periodic sweep (on wall time) may have expired it first")
	for {
		if cc := st.next().GetCancel(); cc != nil {
			require.Equal(t, c.GetId(), cc.GetCommandId())
			break
		}
	}
	var cstate string
	query(t, f.cp.App.DB, `SELECT state FROM commands WHERE id = $1`, []any{c.GetId()}, &cstate)
	require.Equal(t, "expired", cstate)
	require.Equal(t, 1, count(t, f, `SELECT count(*) FROM events WHERE type = 'command.expired' AND resource_id = $1`, c.GetId()))
	// The agent's late report does not revive it.
	st.send(update(c, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, 100))
	st.send(heartbeat())
	time.Sleep(50 * time.Millisecond)
	query(t, f.cp.App.DB, `SELECT state FROM commands WHERE id = $1`, []any{c.GetId()}, &cstate)
	require.Equal(t, "expired", cstate)
}

// TestUnencodableCommandFails: a stored command whose params cannot be
// encoded for the agent is failed at delivery, with its event, instead of
// staying open until its deadline; the commands after it still go out.
func TestUnencodableCommandFails(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "gpu-07")
	a.join(tok)
	st := a.session(0, "")
	require.NotNil(t, st.next().GetInventoryRequest())

	var tenant string
	query(t, f.cp.App.DB, `SELECT tenant_id FROM nodes WHERE id = $1`, []any{a.nodeID}, &tenant)
	now := f.cp.Clock.Now()
	bad := map[string]string{
		"array":   `["not", "an", "object"]`,
		"garbage": `{"a":`,
		"huge":    `{"blob":"` + strings.Repeat("x", fleet.MaxCommandParamsBytes) + `"}`,
	}
	ids := map[string]string{}
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		for _, name := range []string{"array", "garbage", "huge"} {
			c, _, err := fleet.CommandInsert(ctx, tx, &fleet.CommandInsertParams{
				ID: envelope.NewID(fleet.CommandIDPrefix, now), TenantID: tenant, NodeID: a.nodeID, Kind: "allocation.bind",
				Params: bad[name], Deadline: now.Add(time.Hour), CreateTime: now,
			})
			if err != nil {
				return err
			}
			ids[name] = c.ID
		}
		return nil
	}))
	run, err := f.cp.Admin().Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: a.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	c := st.nextCommand()
	require.Equal(t, run.Msg.GetCommand().GetId(), c.GetId(), "the command after the unencodable ones goes out")
	require.Equal(t, uint64(4), c.GetSeq())
	for name, id := range ids {
		eventually(t, func() bool {
			var state, code, msg string
			query(t, f.cp.App.DB, `SELECT state, failure_code, message FROM commands WHERE id = $1`, []any{id}, &state, &code, &msg)
			return state == fleet.CommandFailed && code == fleet.CommandFailUnencodable && strings.Contains(msg, "cannot be encoded")
		}, name+" command failed at once")
		require.Equal(t, 1, count(t, f, `SELECT count(*) FROM events WHERE type = 'command.failed' AND resource_id = $1`, id), name)
	}
}

// TestJoinRoleFromToken: the join token decides the agent's role. A join
// asking for another role is refused and writes nothing; a Hello claiming
// another mode than its certificate's role is refused, so it cannot
// rewrite the node's mode (which a rejoin used to be issued).
func TestJoinRoleFromToken(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	mint := func(role string) (string, string) {
		res, err := f.cp.Admin().JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{
			Tenant: "acme", Project: "gpu", Role: role,
		}))
		require.NoError(t, err)
		return res.Msg.GetJoinToken().GetId(), res.Msg.GetToken()
	}
	joinAs := func(a *agent, tok string, mode agentv1.AgentMode) (*agentv1.JoinResponse, error) {
		req := a.joinRequest(tok)
		req.Mode = mode
		return a.dial(nil).Join(ctx, req)
	}

	nodeTok, nodeTokSecret := mint("")
	a := newAgent(t, f, "gpu-11")
	for _, mode := range []agentv1.AgentMode{agentv1.AgentMode_AGENT_MODE_SITE, agentv1.AgentMode_AGENT_MODE_RAMDISK} {
		_, err := joinAs(a, nodeTokSecret, mode)
		requireCode(t, err, codes.PermissionDenied, "admits a node agent")
	}
	var used int
	query(t, f.cp.App.DB, `SELECT count(*) FROM join_tokens WHERE id = $1 AND used_time IS NULL AND csr_sha256 = ''`, []any{nodeTok}, &used)
	require.Equal(t, 1, used, "a refused join leaves the token unused")
	require.Zero(t, count(t, f, `SELECT count(*) FROM nodes WHERE name = 'gpu-11'`))
	a.join(nodeTokSecret)
	var mode string
	query(t, f.cp.App.DB, `SELECT mode FROM nodes WHERE id = $1`, []any{a.nodeID}, &mode)
	require.Equal(t, "node", mode)
	// A retry of the admitted join in another mode is refused as well.
	_, err := joinAs(a, nodeTokSecret, agentv1.AgentMode_AGENT_MODE_SITE)
	requireCode(t, err, codes.PermissionDenied, "admits a node agent")

	// A Hello in site mode on a node certificate is refused; the mode stays.
	st := a.open(nil)
	st.send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{
		AgentVersion: "0.1.0", Mode: agentv1.AgentMode_AGENT_MODE_SITE, TrustVersion: 1,
	}}})
	got := st.closed()
	require.Equal(t, codes.PermissionDenied, got.Code(), "%v", got)
	require.Contains(t, got.Message(), "certificate is for role node")
	query(t, f.cp.App.DB, `SELECT mode FROM nodes WHERE id = $1`, []any{a.nodeID}, &mode)
	require.Equal(t, "node", mode)
	again := a.join(nodeTokSecret)
	require.Equal(t, a.nodeID, again.GetNodeId())

	// A site token admits a site agent only.
	siteTok, siteTokSecret := mint("site")
	s := newAgent(t, f, "site-1")
	_, err = joinAs(s, siteTokSecret, agentv1.AgentMode_AGENT_MODE_NODE)
	requireCode(t, err, codes.PermissionDenied, "admits a site agent")
	res, err := joinAs(s, siteTokSecret, agentv1.AgentMode_AGENT_MODE_SITE)
	require.NoError(t, err)
	require.Equal(t, agentv1.JoinStatus_JOIN_STATUS_ADMITTED, res.GetStatus())
	query(t, f.cp.App.DB, `SELECT mode FROM nodes WHERE id = $1`, []any{res.GetNodeId()}, &mode)
	require.Equal(t, "site", mode)
	leaf, err := x509.ParseCertificate(res.GetCertificateChain()[0])
	require.NoError(t, err)
	require.Contains(t, leaf.Subject.OrganizationalUnit, "bc-role:site")
	jt, err := f.cp.Admin().JoinTokens.List(ctx, connect.NewRequest(&apiv1.ListJoinTokensRequest{Tenant: "acme", IncludeInactive: true}))
	require.NoError(t, err)
	roles := map[string]string{}
	for _, tok := range jt.Msg.GetJoinTokens() {
		roles[tok.GetId()] = tok.GetRole()
	}
	require.Equal(t, map[string]string{nodeTok: "node", siteTok: "site"}, roles)

	_, err = f.cp.Admin().JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "gpu", Role: "gateway"}))
	require.Error(t, err)
	require.Contains(t, err.Error(), "role")
}
