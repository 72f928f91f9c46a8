package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
)

// fleetFake is an in-memory fleet API: nodes, commands that advance one
// state per Get, join tokens and requests.
type fleetFake struct {
	f *fake

	mu       sync.Mutex
	nodes    []*apiv1.Node
	commands map[string]*apiv1.Command
	// finalState is where commands end up: succeeded unless a test says so.
	finalState string
	requests   []*apiv1.JoinRequest
	runs       []*apiv1.RunCommandRequest
}

func setupFleet(t *testing.T) (*bundle, *fleetFake) {
	t.Helper()
	ff := &fleetFake{f: newFake(), commands: map[string]*apiv1.Command{}, finalState: "succeeded",
		nodes: []*apiv1.Node{
			{Id: "nod_1", Name: "gpu-1", TenantId: "ten_1", State: "active", Liveness: "ready", Pool: "h100",
				GpuCount: 8, GpuModel: "NVIDIA H100 80GB HBM3", CreateTime: created, Labels: map[string]string{"rack": "r1"},
				DerivedLabels: map[string]string{"gpu.model": "H100", "gpu.count": "8", "gpu.memory": "80GB"}, LastHeartbeat: timestamppb.New(time.Now().Add(-3 * time.Second)),
				Conditions: []*apiv1.NodeCondition{{Type: "GpuHealthy", Status: "true", Reason: "AllHealthy"}}},
			{Id: "nod_2", Name: "cpu-1", TenantId: "ten_1", State: "joining", Liveness: "ready", CreateTime: created},
		},
		requests: []*apiv1.JoinRequest{{Id: "jrq_1", TenantId: "ten_1", State: "pending", Identity: "To Be Filled By O.E.M.", TokenId: "jtk_1"}},
	}
	opt := connect.WithInterceptors(recorder{ff.f})
	mux := http.NewServeMux()
	mux.Handle(apiv1connect.NewIdentityServiceHandler(identitySvc{ff.f}, opt))
	mux.Handle(apiv1connect.NewNodeServiceHandler(fakeNodes{ff}, opt))
	mux.Handle(apiv1connect.NewCommandServiceHandler(fakeCommands{ff}, opt))
	mux.Handle(apiv1connect.NewJoinTokenServiceHandler(fakeJoinTokens{ff}, opt))
	mux.Handle(apiv1connect.NewJoinRequestServiceHandler(fakeJoinRequests{ff}, opt))
	mux.Handle(apiv1connect.NewInventoryServiceHandler(fakeInventory{ff}, opt))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	return &bundle{f: ff.f, srv: srv, cfgPath: filepath.Join(dir, "cfg", "config.yaml"), env: map[string]string{"HOME": dir}}, ff
}

type fakeNodes struct{ ff *fleetFake }

func (s fakeNodes) List(_ context.Context, req *connect.Request[apiv1.ListNodesRequest]) (*connect.Response[apiv1.ListNodesResponse], error) {
	s.ff.mu.Lock()
	defer s.ff.mu.Unlock()
	var out []*apiv1.Node
	for _, n := range s.ff.nodes {
		if req.Msg.GetState() == "" || n.GetState() == req.Msg.GetState() {
			out = append(out, n)
		}
	}
	items, next := page(s.ff.f, out, req.Msg.GetPageToken(), req.Msg.GetPageSize())
	return connect.NewResponse(&apiv1.ListNodesResponse{Nodes: items, NextPageToken: next}), nil
}

func (s fakeNodes) node(ref string) (*apiv1.Node, error) {
	for _, n := range s.ff.nodes {
		if n.GetId() == ref || n.GetName() == ref {
			return n, nil
		}
	}
	return nil, apiError(connect.CodeNotFound, "NOT_FOUND", "node "+ref+" not found", "")
}

func (s fakeNodes) Get(_ context.Context, req *connect.Request[apiv1.GetNodeRequest]) (*connect.Response[apiv1.GetNodeResponse], error) {
	s.ff.mu.Lock()
	defer s.ff.mu.Unlock()
	n, err := s.node(req.Msg.GetNode())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.GetNodeResponse{Node: n}), nil
}

func (s fakeNodes) Drain(_ context.Context, req *connect.Request[apiv1.DrainNodeRequest]) (*connect.Response[apiv1.DrainNodeResponse], error) {
	s.ff.mu.Lock()
	defer s.ff.mu.Unlock()
	n, err := s.node(req.Msg.GetNode())
	if err != nil {
		return nil, err
	}
	n.State = "draining"
	return connect.NewResponse(&apiv1.DrainNodeResponse{Node: n, Command: &apiv1.Command{Id: "cmd_drain", Kind: "node.drain", State: "pending"}}), nil
}

func (s fakeNodes) Undrain(_ context.Context, req *connect.Request[apiv1.UndrainNodeRequest]) (*connect.Response[apiv1.UndrainNodeResponse], error) {
	s.ff.mu.Lock()
	defer s.ff.mu.Unlock()
	n, err := s.node(req.Msg.GetNode())
	if err != nil {
		return nil, err
	}
	n.State = "active"
	return connect.NewResponse(&apiv1.UndrainNodeResponse{Node: n}), nil
}

func (s fakeNodes) Delete(_ context.Context, req *connect.Request[apiv1.DeleteNodeRequest]) (*connect.Response[apiv1.DeleteNodeResponse], error) {
	s.ff.mu.Lock()
	defer s.ff.mu.Unlock()
	n, err := s.node(req.Msg.GetNode())
	if err != nil {
		return nil, err
	}
	if n.GetState() != "joining" && n.GetState() != "retired" {
		return nil, apiError(connect.CodeFailedPrecondition, "FAILED_PRECONDITION", "node "+n.GetName()+" is "+n.GetState(), "")
	}
	return connect.NewResponse(&apiv1.DeleteNodeResponse{RevokedCertificates: 1}), nil
}

type fakeCommands struct{ ff *fleetFake }

func (s fakeCommands) Run(_ context.Context, req *connect.Request[apiv1.RunCommandRequest]) (*connect.Response[apiv1.RunCommandResponse], error) {
	s.ff.mu.Lock()
	defer s.ff.mu.Unlock()
	s.ff.runs = append(s.ff.runs, req.Msg)
	if req.Msg.GetKind() != "inventory.refresh" && req.Msg.GetKind() != "node.drain" {
		return nil, apiError(connect.CodeInvalidArgument, "INVALID_ARGUMENT", "invalid kind", "", &apiv1.FieldViolation{Field: "kind", Reason: "must be inventory.refresh or node.drain"})
	}
	c := &apiv1.Command{Id: "cmd_" + req.Msg.GetKind(), NodeId: "nod_1", Seq: int64(len(s.ff.runs)), Kind: req.Msg.GetKind(),
		Params: req.Msg.GetParams(), State: "pending", CreateTime: created}
	s.ff.commands[c.GetId()] = c
	return connect.NewResponse(&apiv1.RunCommandResponse{Command: c}), nil
}

func (s fakeCommands) Get(_ context.Context, req *connect.Request[apiv1.GetCommandRequest]) (*connect.Response[apiv1.GetCommandResponse], error) {
	s.ff.mu.Lock()
	defer s.ff.mu.Unlock()
	c, ok := s.ff.commands[req.Msg.GetId()]
	if !ok {
		return nil, apiError(connect.CodeNotFound, "NOT_FOUND", "command not found", "")
	}
	// Each read moves the command on: pending → running → final.
	switch c.GetState() {
	case "pending":
		c.State, c.Progress = "running", 50
	case "running":
		c.State, c.Progress = s.ff.finalState, 100
		if c.State == "failed" {
			c.FailureCode, c.Message = "NVML_ERROR", "nvml went away"
		}
	}
	return connect.NewResponse(&apiv1.GetCommandResponse{Command: c}), nil
}

func (s fakeCommands) List(_ context.Context, req *connect.Request[apiv1.ListCommandsRequest]) (*connect.Response[apiv1.ListCommandsResponse], error) {
	s.ff.mu.Lock()
	defer s.ff.mu.Unlock()
	out := &apiv1.ListCommandsResponse{}
	for _, c := range s.ff.commands {
		out.Commands = append(out.Commands, c)
	}
	return connect.NewResponse(out), nil
}

func (s fakeCommands) Cancel(_ context.Context, req *connect.Request[apiv1.CancelCommandRequest]) (*connect.Response[apiv1.CancelCommandResponse], error) {
	s.ff.mu.Lock()
	defer s.ff.mu.Unlock()
	c, ok := s.ff.commands[req.Msg.GetId()]
	if !ok {
		return nil, apiError(connect.CodeNotFound, "NOT_FOUND", "command not found", "")
	}
	c.State = "canceled"
	return connect.NewResponse(&apiv1.CancelCommandResponse{Command: c}), nil
}

type fakeJoinTokens struct{ ff *fleetFake }

func (s fakeJoinTokens) Create(_ context.Context, req *connect.Request[apiv1.CreateJoinTokenRequest]) (*connect.Response[apiv1.CreateJoinTokenResponse], error) {
	m := req.Msg
	return connect.NewResponse(&apiv1.CreateJoinTokenResponse{
		JoinToken: &apiv1.JoinToken{Id: "jtk_1", TenantId: m.GetTenant(), ProjectId: m.GetProject(), Pool: m.GetPool(), Labels: m.GetLabels(), Role: m.GetRole(),
			SiteId: m.GetSite(), State: "active", CreateTime: created, ExpireTime: timestamppb.New(created.AsTime().Add(time.Duration(m.GetTtlSeconds()) * time.Second))},
		Token: "bcjt_PIN.sealed-token",
	}), nil
}

func (s fakeJoinTokens) List(context.Context, *connect.Request[apiv1.ListJoinTokensRequest]) (*connect.Response[apiv1.ListJoinTokensResponse], error) {
	return connect.NewResponse(&apiv1.ListJoinTokensResponse{JoinTokens: []*apiv1.JoinToken{{Id: "jtk_1", State: "active", Labels: map[string]string{"b": "2", "a": "1"}}}}), nil
}

func (s fakeJoinTokens) Revoke(_ context.Context, req *connect.Request[apiv1.RevokeJoinTokenRequest]) (*connect.Response[apiv1.RevokeJoinTokenResponse], error) {
	return connect.NewResponse(&apiv1.RevokeJoinTokenResponse{JoinToken: &apiv1.JoinToken{Id: req.Msg.GetId(), State: "revoked"}}), nil
}

type fakeJoinRequests struct{ ff *fleetFake }

func (s fakeJoinRequests) List(context.Context, *connect.Request[apiv1.ListJoinRequestsRequest]) (*connect.Response[apiv1.ListJoinRequestsResponse], error) {
	s.ff.mu.Lock()
	defer s.ff.mu.Unlock()
	return connect.NewResponse(&apiv1.ListJoinRequestsResponse{JoinRequests: s.ff.requests}), nil
}

func (s fakeJoinRequests) decide(id, state string) (*apiv1.JoinRequest, error) {
	s.ff.mu.Lock()
	defer s.ff.mu.Unlock()
	for _, r := range s.ff.requests {
		if r.GetId() == id {
			if r.GetState() != "pending" {
				return nil, apiError(connect.CodeFailedPrecondition, "FAILED_PRECONDITION", "join request "+id+" is "+r.GetState(), "")
			}
			r.State, r.DecidedBy = state, "usr_root"
			return r, nil
		}
	}
	return nil, apiError(connect.CodeNotFound, "NOT_FOUND", "join request not found", "")
}

func (s fakeJoinRequests) Approve(_ context.Context, req *connect.Request[apiv1.ApproveJoinRequestRequest]) (*connect.Response[apiv1.ApproveJoinRequestResponse], error) {
	r, err := s.decide(req.Msg.GetId(), "approved")
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.ApproveJoinRequestResponse{JoinRequest: r}), nil
}

func (s fakeJoinRequests) Reject(_ context.Context, req *connect.Request[apiv1.RejectJoinRequestRequest]) (*connect.Response[apiv1.RejectJoinRequestResponse], error) {
	r, err := s.decide(req.Msg.GetId(), "rejected")
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.RejectJoinRequestResponse{JoinRequest: r}), nil
}

type fakeInventory struct{ ff *fleetFake }

func (s fakeInventory) Get(_ context.Context, req *connect.Request[apiv1.GetInventoryRequest]) (*connect.Response[apiv1.GetInventoryResponse], error) {
	return connect.NewResponse(&apiv1.GetInventoryResponse{
		NodeId: "nod_1", Digest: "sha256:abc",
		Gpus: []*apiv1.Gpu{{Uuid: "GPU-1", Index: 0, Model: "NVIDIA A100-SXM4-80GB", MemoryMib: 81920, MigMode: "enabled",
			MigInstances: []*apiv1.MigInstance{{Uuid: "MIG-1", Profile: "3g.40gb"}}}},
		Resources: &apiv1.NodeResources{CpuModel: "AMD EPYC 7763", Sockets: 2, Cores: 64, Threads: 128, MemoryMib: 1030000},
	}), nil
}

func TestNodesCLI(t *testing.T) {
	t.Parallel()
	b, _ := setupFleet(t)

	out := b.ok(t, "nodes", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	require.Regexp(t, `^NAME\s+ID\s+STATE\s+LIVENESS\s+GPUS\s+POOL\s+AGE\s+LAST SEEN$`, lines[0])
	// The GPU model by the name the gpu.model label and --model use.
	require.Regexp(t, `^gpu-1\s+nod_1\s+active\s+ready\s+8 × H100\s+h100\s+\d+d\s+\ds ago$`, lines[1])
	require.Regexp(t, `^cpu-1\s+nod_2\s+joining\s+ready\s+-\s+-\s+\d+d\s+never$`, lines[2])

	var listed struct{ Nodes []struct{ Name string } }
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "nodes", "list", "--state", "joining", "-o", "json")), &listed))
	require.Len(t, listed.Nodes, 1)
	require.Equal(t, "cpu-1", listed.Nodes[0].Name)

	// --show-labels: every label a pool selector matches.
	lines = strings.Split(strings.TrimSpace(b.ok(t, "nodes", "list", "--show-labels")), "\n")
	require.Regexp(t, `\sLABELS$`, lines[0])
	require.Regexp(t, `\sgpu\.count=8,gpu\.memory=80GB,gpu\.model=H100,rack=r1$`, lines[1])
	require.Regexp(t, `\s-$`, lines[2])

	out = b.ok(t, "nodes", "get", "gpu-1")
	require.Contains(t, out, "GpuHealthy")
	require.Contains(t, out, "labels: rack=r1\n")
	require.Contains(t, out, "derived labels: gpu.count=8,gpu.memory=80GB,gpu.model=H100\n")
	require.Contains(t, b.ok(t, "nodes", "drain", "gpu-1", "--reason", "bios update"), "command: cmd_drain (node.drain)")
	require.Contains(t, b.ok(t, "nodes", "undrain", "gpu-1"), "active")
	require.Contains(t, b.ok(t, "nodes", "delete", "cpu-1"), "node cpu-1 deleted; 1 certificates revoked")

	r := b.run(t, "", "nodes", "delete", "gpu-1")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "Error: FAILED_PRECONDITION: node gpu-1 is active")
	r = b.run(t, "", "nodes", "get")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "NODE: required")
}

func TestCommandsCLI(t *testing.T) {
	t.Parallel()
	b, ff := setupFleet(t)

	out := b.ok(t, "commands", "run", "inventory.refresh", "--node", "gpu-1", "--param", "sections=[\"gpus\"]",
		"--param", "force=true", "--param", "note=hello world", "--deadline", "10m")
	require.Contains(t, out, "cmd_inventory.refresh")
	require.Contains(t, out, "pending")
	ff.mu.Lock()
	run := ff.runs[0]
	ff.mu.Unlock()
	require.EqualValues(t, 600, run.GetDeadlineSeconds())
	require.Equal(t, map[string]any{"sections": []any{"gpus"}, "force": true, "note": "hello world"}, run.GetParams().AsMap())
	calls := b.f.callsTo("CommandService/Run")
	require.NotEmpty(t, calls[0].header.Get("Idempotency-Key"), "run is a create: it carries an Idempotency-Key")

	out = b.ok(t, "commands", "run", "inventory.refresh", "--node", "gpu-1", "--wait", "-o", "json")
	var got struct{ Command struct{ State string } }
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Equal(t, "succeeded", got.Command.State)
	require.GreaterOrEqual(t, len(b.f.callsTo("CommandService/Get")), 2, "wait polls until the command finishes")

	ff.mu.Lock()
	ff.finalState = "failed"
	ff.mu.Unlock()
	r := b.run(t, "", "commands", "run", "node.drain", "--node", "gpu-1", "--wait")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stdout, "failed")
	require.Contains(t, r.stderr, "nvml went away")

	r = b.run(t, "", "commands", "run", "inventory.refresh")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "node: required")
	r = b.run(t, "", "commands", "run", "inventory.refresh", "--node", "gpu-1", "--param", "novalue")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "param: must be k=v")
	r = b.run(t, "", "commands", "run", "allocation.bind", "--node", "gpu-1")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "KIND: must be inventory.refresh or node.drain")

	require.Contains(t, b.ok(t, "commands", "cancel", "cmd_inventory.refresh"), "canceled")
	require.Contains(t, b.ok(t, "commands", "list", "--node", "gpu-1"), "cmd_inventory.refresh")
	require.Contains(t, b.ok(t, "commands", "get", "cmd_inventory.refresh"), "cmd_inventory.refresh")
}

func TestJoinTokensCLI(t *testing.T) {
	t.Parallel()
	b, _ := setupFleet(t)

	out := b.ok(t, "join-tokens", "create", "--tenant", "acme", "--project", "web", "--pool", "h100", "--label", "rack=r1", "--ttl", "2h")
	require.Contains(t, out, "token: bcjt_PIN.sealed-token  (shown once; store it now)")
	require.Contains(t, out, "rack=r1")
	calls := b.f.callsTo("JoinTokenService/Create")
	require.NotEmpty(t, calls[0].header.Get("Idempotency-Key"))

	var created struct {
		JoinToken struct{ Id, Pool string } `json:"joinToken"`
		Token     string                    `json:"token"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "join-tokens", "create", "--tenant", "acme", "--project", "web", "-o", "json")), &created))
	require.Equal(t, "bcjt_PIN.sealed-token", created.Token)
	require.Equal(t, "jtk_1", created.JoinToken.Id)
	site := b.ok(t, "join-tokens", "create", "--tenant", "acme", "--project", "web", "--role", "site")
	require.Regexp(t, `jtk_1\s+active\s+site\s`, site, "the role the token binds is shown")

	// A site token: role site, bound to its site, printed once.
	st := b.ok(t, "site-tokens", "create", "--tenant", "acme", "--project", "web", "--site", "dc1")
	require.Regexp(t, `jtk_1\s+active\s+site\s.*\sdc1\s*\n`, st, "the token's role and site are shown")
	require.Contains(t, st, "token: bcjt_PIN.sealed-token  (shown once; store it now)")
	r0 := b.run(t, "", "site-tokens", "create", "--tenant", "acme", "--project", "web")
	require.Equal(t, 1, r0.code)
	require.Contains(t, r0.stderr, "site: required")

	list := b.ok(t, "join-tokens", "list", "--tenant", "acme")
	require.Contains(t, list, "a=1,b=2")
	require.NotContains(t, list, "bcjt_")
	require.Contains(t, b.ok(t, "join-tokens", "revoke", "jtk_1", "--tenant", "acme"), "revoked")

	r := b.run(t, "", "join-tokens", "create", "--tenant", "acme")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "project: required")
	r = b.run(t, "", "join-tokens", "create", "--tenant", "acme", "--project", "web", "--label", "oops")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "label: must be k=v")
}

func TestJoinRequestsAndInventoryCLI(t *testing.T) {
	t.Parallel()
	b, _ := setupFleet(t)

	require.Contains(t, b.ok(t, "join-requests", "list", "--tenant", "acme"), "To Be Filled By O.E.M.")
	require.Contains(t, b.ok(t, "join-requests", "approve", "jrq_1", "--tenant", "acme"), "approved")
	r := b.run(t, "", "join-requests", "reject", "jrq_1", "--tenant", "acme")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "FAILED_PRECONDITION")

	out := b.ok(t, "inventory", "get", "gpu-1")
	require.Contains(t, out, "NVIDIA A100-SXM4-80GB")
	require.Contains(t, out, "enabled (1 instances)")
	require.Contains(t, out, "cpu: AMD EPYC 7763, 2 sockets, 64 cores, 128 threads")
	var inv struct{ Gpus []struct{ Uuid string } }
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "inventory", "get", "gpu-1", "-o", "json")), &inv))
	require.Equal(t, "GPU-1", inv.Gpus[0].Uuid)
}
