package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func execOut(stream, data string) *apiv1.ExecReservationResponse {
	return &apiv1.ExecReservationResponse{Event: &apiv1.ExecReservationResponse_Output{Output: &apiv1.ExecOutput{Stream: stream, Data: []byte(data)}}}
}

func execEnd(e *apiv1.ExecExit) *apiv1.ExecReservationResponse {
	return &apiv1.ExecReservationResponse{Event: &apiv1.ExecReservationResponse_Exit{Exit: e}}
}

func TestReservationsExecStreamsAndExits(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)
	started := &apiv1.ExecReservationResponse{Event: &apiv1.ExecReservationResponse_Started{Started: &apiv1.ExecStarted{CommandId: "cmd_1", NodeId: "nod_1"}}}
	for _, c := range []struct {
		name   string
		exit   *apiv1.ExecExit
		code   int
		stderr string
	}{
		{"exit 0", &apiv1.ExecExit{State: "succeeded", CgroupEntered: true}, 0, "err\n"},
		{"exit 3", &apiv1.ExecExit{State: "succeeded", ExitCode: 3, CgroupEntered: true}, 3, "err\n"},
		{"killed", &apiv1.ExecExit{State: "succeeded", ExitCode: -1, Signal: "SIGKILL", CgroupEntered: true}, 137, "err\nkilled by SIGKILL\n"},
		{"dropped, outside a cgroup", &apiv1.ExecExit{State: "succeeded", DroppedBytes: 42, CgroupNote: "/x is not on a cgroup v2 filesystem"}, 0,
			"err\nnote: 42 bytes of output were dropped (caps: 1 MiB/s, 64 MiB in all)\nnote: /x is not on a cgroup v2 filesystem\n"},
		{"canceled", &apiv1.ExecExit{State: "canceled", Message: "canceled", ExitCode: -1}, 130, "err\ncanceled: canceled\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rf.locked(func() {
				rf.execEvents = []*apiv1.ExecReservationResponse{started, execOut("stdout", "0,1\n"), execOut("stderr", "err\n"), execEnd(c.exit)}
			})
			r := b.run(t, "", "reservations", "exec", "rsv_1", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES", "--gpu-env=false")
			require.Equal(t, c.code, r.code, "stderr: %s", r.stderr)
			require.Equal(t, "0,1\n", r.stdout)
			require.Equal(t, c.stderr, r.stderr)
		})
	}
	rf.locked(func() {
		last := rf.execs[len(rf.execs)-1]
		// Everything after -- is the command, flags included.
		require.Equal(t, []string{"sh", "-c", "echo $CUDA_VISIBLE_DEVICES", "--gpu-env=false"}, last.GetArgv())
		require.False(t, last.GetOmitGpuEnv())
		require.Equal(t, "rsv_1", last.GetReservation())
	})

	// A process that could not start is the CLI's error, with its code.
	rf.locked(func() {
		rf.execEvents = []*apiv1.ExecReservationResponse{started, execEnd(&apiv1.ExecExit{State: "failed", FailureCode: "EXEC_START_FAILED", Message: `"nope" not found`})}
	})
	r := b.run(t, "", "reservations", "exec", "--gpu-env=false", "rsv_1", "--", "nope")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `EXEC_START_FAILED: "nope" not found`)
	rf.locked(func() { require.True(t, rf.execs[len(rf.execs)-1].GetOmitGpuEnv()) })

	// A stream that ends without an exit is not a success.
	rf.locked(func() { rf.execEvents = []*apiv1.ExecReservationResponse{started} })
	r = b.run(t, "", "reservations", "exec", "rsv_1", "--", "true")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "ended before the process's exit")
}

func TestReservationsExecUsage(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)
	for _, c := range []struct {
		argv []string
		want string
	}{
		{[]string{"reservations", "exec"}, "invalid ID: required"},
		{[]string{"reservations", "exec", "rsv_1", "true"}, "give the command after --"},
		{[]string{"reservations", "exec", "rsv_1", "rsv_2", "--", "true"}, "exactly one reservation ID goes before --"},
		{[]string{"reservations", "exec", "rsv_1", "--"}, "invalid command: required after --"},
	} {
		r := b.run(t, "", c.argv...)
		require.Equal(t, 1, r.code, "%v", c.argv)
		require.Contains(t, r.stderr, c.want, "%v", c.argv)
	}
	rf.locked(func() { require.Empty(t, rf.execs, "nothing reached the server") })
}

// TestReservationsExecEndToEnd runs the real thing: a control plane, a
// simulated node running the real agent, a reservation of two GPUs, and
// the CLI's exec printing the GPUs and the process's cgroup.
func TestReservationsExecEndToEnd(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
	require.NoError(t, err)
	key, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "member"}))
	require.NoError(t, err)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	bctest.WaitFor(t, "the node's GPUs in inventory", func() bool {
		n, err := admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme"}))
		require.NoError(t, err)
		return len(n.Msg.GetNodes()) == 1 && n.Msg.GetNodes()[0].GetGpuCount() == 8
	})
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	member := cp.Client(key.Msg.GetSecret())
	res, err := member.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 2, DurationSeconds: 3600}))
	require.NoError(t, err)
	id := res.Msg.GetReservation().GetId()
	var rsv *apiv1.Reservation
	bctest.WaitFor(t, "the reservation active", func() bool {
		g, err := member.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: id}))
		require.NoError(t, err)
		rsv = g.Msg.GetReservation()
		return rsv.GetState() == "active"
	})
	inv, err := admin.Inventory.Get(ctx, connect.NewRequest(&apiv1.GetInventoryRequest{Tenant: "acme", Node: rsv.GetPlacement().GetNodeId()}))
	require.NoError(t, err)
	index := map[string]int32{}
	for _, g := range inv.Msg.GetGpus() {
		index[g.GetUuid()] = g.GetIndex()
	}
	var want []string
	for _, a := range rsv.GetPlacement().GetAtoms() {
		want = append(want, fmt.Sprint(index[a]))
	}

	home := t.TempDir()
	env := map[string]string{envConfig: home + "/config.yaml", envServer: cp.URL, envToken: key.Msg.GetSecret(), "HOME": home}
	a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
	var out, errb strings.Builder
	code := run(t.Context(), a, []string{"reservations", "exec", id, "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; cat /proc/self/cgroup; exit 4"},
		strings.NewReader(""), &out, &errb)
	require.Equal(t, 4, code, "stderr: %s", errb.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Equal(t, strings.Join(want, ","), lines[0])
	self, err := os.ReadFile("/proc/self/cgroup")
	require.NoError(t, err)
	// Confined (bcd runs as root), the process's cgroup namespace is
	// rooted at the cgroups it started in: every hierarchy reads "/".
	var rooted []string
	for _, l := range strings.Split(strings.TrimSpace(string(self)), "\n") {
		rooted = append(rooted, l[:strings.LastIndexByte(l, ':')+1]+"/")
	}
	require.Contains(t, []string{strings.TrimSpace(string(self)), strings.Join(rooted, "\n")}, strings.Join(lines[1:], "\n"),
		"a simulated node's cgroup root is a plain directory: the process runs in the simulator's cgroup")
	require.Contains(t, errb.String(), "is not on a cgroup v2 filesystem", "and the CLI says so")
}
