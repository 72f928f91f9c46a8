package gateway_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
)

// requireDefused fails when s still holds a character that would drive an
// operator's terminal, and checks the readable part of the report stayed.
func requireDefused(t *testing.T, s, keep string) {
	t.Helper()
	require.True(t, utf8.ValidString(s), "%q", s)
	require.Empty(t, envelope.TextProblem(s, false), "%q", s)
	require.Contains(t, s, keep, "the report itself is kept")
	require.Contains(t, s, "\uFFFD", "the hostile characters are marked, not silently dropped")
}

// TestHostileNodeTextStoredSanitized: a node (a compromised one, or a
// driver printing colours) cannot paint "SUCCEEDED" over a failed command,
// reverse a line, or clear an operator's screen with what it reports:
// command update messages, health event messages and devices, and the
// inventory's model names are stored with those characters replaced.
func TestHostileNodeTextStoredSanitized(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.cp.Admin()
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "gpu-77")
	a.join(tok)
	st := a.session(0, "")

	// A failed command whose message repaints itself green as SUCCEEDED.
	run, err := admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: a.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	c := st.nextCommand()
	failed := update(c, agentv1.CommandState_COMMAND_STATE_FAILED, 0)
	failed.GetCommandUpdate().Message = "disk full\r\x1b[2K\x1b[32mSUCCEEDED\x1b[0m \u202edeliaf\u202c\x00\x7f\u0085\u009b"
	failed.GetCommandUpdate().FailureCode = "DISK_FULL"
	st.send(failed)
	eventually(t, func() bool {
		var state string
		query(t, f.cp.App.DB, `SELECT state FROM commands WHERE id = $1`, []any{c.GetId()}, &state)
		return state == "failed"
	}, "command failed")
	var msg string
	query(t, f.cp.App.DB, `SELECT message FROM commands WHERE id = $1`, []any{c.GetId()}, &msg)
	requireDefused(t, msg, "SUCCEEDED")
	require.True(t, strings.HasPrefix(msg, "disk full"), "%q", msg)
	got, err := admin.Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Tenant: "acme", Id: run.Msg.GetCommand().GetId()}))
	require.NoError(t, err)
	require.Equal(t, msg, got.Msg.GetCommand().GetMessage(), "the API answers what was stored")

	// A fatal XID whose device and message carry escapes: the quarantine
	// condition keeps both, defused.
	st.send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Status{Status: &agentv1.StatusReport{Health: "degraded", Events: []*agentv1.HealthEvent{{
		Kind: "gpu.xid", Code: 79, Device: "GPU-1\x1b]0;owned\x07", Message: "fallen off the bus\x1b[8m hidden\u2066",
	}}}}})
	eventually(t, func() bool {
		return count(t, f, `SELECT count(*) FROM node_conditions WHERE node_id = $1 AND type LIKE 'GpuQuarantined/%'`, a.nodeID) == 1
	}, "quarantine condition")
	var ctype, cmsg string
	query(t, f.cp.App.DB, `SELECT type, message FROM node_conditions WHERE node_id = $1 AND type LIKE 'GpuQuarantined/%'`, []any{a.nodeID}, &ctype, &cmsg)
	requireDefused(t, ctype, "GPU-1")
	requireDefused(t, cmsg, "fallen off the bus")

	// An inventory whose GPU model name clears the screen.
	gpus := []*agentv1.Gpu{{Index: 0, Uuid: a.identity.GpuUuids[0], Model: "NVIDIA H100\x1b[2J\u202e", MemoryMib: 81559, PciBusId: "0000:18:00.0"}}
	digest, msgs := snapshot(gpuSections(a, gpus)...)
	for _, m := range msgs {
		st.send(m)
	}
	eventually(t, func() bool {
		var d string
		query(t, f.cp.App.DB, `SELECT inventory_digest FROM nodes WHERE id = $1`, []any{a.nodeID}, &d)
		return d == digest
	}, "snapshot committed")
	var model string
	query(t, f.cp.App.DB, `SELECT model FROM gpus WHERE uuid = $1`, []any{a.identity.GpuUuids[0]}, &model)
	requireDefused(t, model, "NVIDIA H100")
}
