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

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
)

// healthFake answers the health API from fixed data and keeps the
// requests it got.
type healthFake struct {
	apiv1connect.UnimplementedHealthServiceHandler
	mu   sync.Mutex
	reqs []any
}

func (h *healthFake) got(req any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reqs = append(h.reqs, req)
}

func (h *healthFake) last() any {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reqs[len(h.reqs)-1]
}

var fakeFinding = &apiv1.HealthFinding{Id: "hfd_1", NodeId: "nod_1", Node: "gpu-1", GpuUuid: "GPU-aaa", GpuIndex: 3, Kind: "gpu.xid",
	Code: 79, Severity: "critical", Action: "reboot", State: "open", Count: 1, Message: "fallen off the bus", UpdateTime: created}

func (h *healthFake) GetNodeHealth(_ context.Context, req *connect.Request[apiv1.GetNodeHealthRequest]) (*connect.Response[apiv1.GetNodeHealthResponse], error) {
	h.got(req.Msg)
	return connect.NewResponse(&apiv1.GetNodeHealthResponse{Health: &apiv1.NodeHealth{NodeId: "nod_1", Node: "gpu-1", Status: "unhealthy",
		PoolId: "pool_1", GpusOut: 1, GpusTotal: 8,
		Gpus:         []*apiv1.GpuHealth{{Uuid: "GPU-aaa", Index: 3, Model: "H100", State: "quarantined", Reason: "XID 79", Reservations: 2}},
		Findings:     []*apiv1.HealthFinding{fakeFinding},
		Remediations: []*apiv1.Remediation{{Id: "hrm_1", NodeId: "nod_1", Node: "gpu-1", Action: "reboot", State: "pending", Reason: "XID 79", CreateTime: created}},
	}}), nil
}

func (h *healthFake) ListFindings(_ context.Context, req *connect.Request[apiv1.ListFindingsRequest]) (*connect.Response[apiv1.ListFindingsResponse], error) {
	h.got(req.Msg)
	return connect.NewResponse(&apiv1.ListFindingsResponse{Findings: []*apiv1.HealthFinding{fakeFinding}, GpusOut: 1, NodesUnhealthy: 1}), nil
}

func (h *healthFake) ListRemediations(_ context.Context, req *connect.Request[apiv1.ListRemediationsRequest]) (*connect.Response[apiv1.ListRemediationsResponse], error) {
	h.got(req.Msg)
	return connect.NewResponse(&apiv1.ListRemediationsResponse{Remediations: []*apiv1.Remediation{
		{Id: "hrm_1", Node: "gpu-1", Action: "reset", State: "running", GpuUuid: "GPU-aaa", WorkflowId: "wfl_1", CreateTime: created}}}), nil
}

func (h *healthFake) GetPoolHealth(_ context.Context, req *connect.Request[apiv1.GetPoolHealthRequest]) (*connect.Response[apiv1.GetPoolHealthResponse], error) {
	h.got(req.Msg)
	return connect.NewResponse(&apiv1.GetPoolHealthResponse{Health: &apiv1.PoolHealth{Pool: "h100", Nodes: 20, NodesUnhealthy: 3,
		GpusTotal: 160, GpusOut: 4, Budget: 1, BudgetUsed: 1, Breaker: "open", BreakerReason: "3 of the pool's 20 nodes turned unhealthy", BreakerTripTime: created}}), nil
}

func (h *healthFake) QuarantineGpu(_ context.Context, req *connect.Request[apiv1.QuarantineGpuRequest]) (*connect.Response[apiv1.QuarantineGpuResponse], error) {
	h.got(req.Msg)
	state := "quarantined"
	if req.Msg.GetRma() {
		state = "rma"
	}
	return connect.NewResponse(&apiv1.QuarantineGpuResponse{Gpu: &apiv1.GpuHealth{Uuid: req.Msg.GetGpu(), State: state},
		Finding: &apiv1.HealthFinding{Id: "hfd_2", Node: "gpu-1"}}), nil
}

func (h *healthFake) LiftGpu(_ context.Context, req *connect.Request[apiv1.LiftGpuRequest]) (*connect.Response[apiv1.LiftGpuResponse], error) {
	h.got(req.Msg)
	if req.Msg.GetGpu() == "GPU-fine" {
		return nil, apiError(connect.CodeFailedPrecondition, "FAILED_PRECONDITION", "GPU GPU-fine of node gpu-1 is not quarantined: there is nothing to lift", "")
	}
	return connect.NewResponse(&apiv1.LiftGpuResponse{Gpu: &apiv1.GpuHealth{Uuid: req.Msg.GetGpu(), State: "ok"}, ResolvedFindings: 2}), nil
}

func (h *healthFake) ResetBreaker(_ context.Context, req *connect.Request[apiv1.ResetBreakerRequest]) (*connect.Response[apiv1.ResetBreakerResponse], error) {
	h.got(req.Msg)
	return connect.NewResponse(&apiv1.ResetBreakerResponse{Health: &apiv1.PoolHealth{Pool: "h100", Nodes: 20, Budget: 1, Breaker: "closed"}}), nil
}

func setupHealth(t *testing.T) (*bundle, *healthFake) {
	t.Helper()
	f := newFake()
	hf := &healthFake{}
	opt := connect.WithInterceptors(recorder{f})
	mux := http.NewServeMux()
	mux.Handle(apiv1connect.NewIdentityServiceHandler(identitySvc{f}, opt))
	mux.Handle(apiv1connect.NewHealthServiceHandler(hf, opt))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	return &bundle{f: f, srv: srv, cfgPath: filepath.Join(dir, "cfg", "config.yaml"), env: map[string]string{"HOME": dir}}, hf
}

func TestHealthCLI(t *testing.T) {
	t.Parallel()
	b, hf := setupHealth(t)

	// Without a node: the tenant's open findings and what they take out.
	out := b.ok(t, "nodes", "health")
	require.Regexp(t, `(?m)^NODE\s+ID\s+KIND\s+CODE\s+SEVERITY\s+ACTION\s+STATE\s+GPU\s+COUNT\s+SEEN\s+MESSAGE$`, out)
	require.Regexp(t, `(?m)^gpu-1\s+hfd_1\s+gpu\.xid\s+79\s+critical\s+reboot\s+open\s+GPU-aaa\s+1\s`, out)
	require.Contains(t, out, "1 GPUs out of placement; 1 nodes with an open error or critical finding")
	require.Equal(t, "open", hf.last().(*apiv1.ListFindingsRequest).GetState())
	var listed struct {
		Findings []struct{ Kind string }
		GpusOut  int `json:"gpusOut"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "nodes", "health", "--pool", "h100", "--min-severity", "error", "-o", "json")), &listed))
	require.Len(t, listed.Findings, 1)
	require.Equal(t, 1, listed.GpusOut)
	require.Equal(t, "h100", hf.last().(*apiv1.ListFindingsRequest).GetPool())
	require.Equal(t, "error", hf.last().(*apiv1.ListFindingsRequest).GetMinSeverity())

	// With a node: its GPUs, findings and remediations.
	out = b.ok(t, "nodes", "health", "gpu-1")
	require.Regexp(t, `(?m)^gpu-1\s+unhealthy\s+pool_1\s+1/8$`, out)
	require.Regexp(t, `(?m)^GPU-aaa\s+3\s+H100\s+quarantined\s+2\s+XID 79$`, out)
	require.Regexp(t, `(?m)^hrm_1\s+reboot\s+pending\s`, out)
	require.Equal(t, "gpu-1", hf.last().(*apiv1.GetNodeHealthRequest).GetNode())

	// Quarantine and lift need a reason; the server is not asked without.
	calls := len(hf.reqs)
	r := b.run(t, "", "gpus", "quarantine", "GPU-aaa")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "reason")
	require.Len(t, hf.reqs, calls)
	out = b.ok(t, "gpus", "quarantine", "GPU-aaa", "--reason", "fan noise", "--rma")
	require.Regexp(t, `(?m)^GPU-aaa\s+gpu-1\s+rma\s+hfd_2$`, out)
	q := hf.last().(*apiv1.QuarantineGpuRequest)
	require.True(t, q.GetRma())
	require.Equal(t, "fan noise", q.GetReason())
	require.Regexp(t, `(?m)^GPU-aaa\s+ok\s+2$`, b.ok(t, "gpus", "lift", "GPU-aaa", "--reason", "fan replaced"))
	r = b.run(t, "", "gpus", "lift", "GPU-fine", "--reason", "r")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "FAILED_PRECONDITION: GPU GPU-fine of node gpu-1 is not quarantined")

	// Pools.
	out = b.ok(t, "pools", "health", "h100")
	require.Regexp(t, `(?m)^h100\s+20\s+3\s+4/160\s+1/1\s+0\s+open$`, out)
	require.Contains(t, out, "breaker: 3 of the pool's 20 nodes turned unhealthy")
	r = b.run(t, "", "pools", "reset-breaker", "h100")
	require.Equal(t, 1, r.code)
	require.Regexp(t, `(?m)^h100\s+20\s+0\s+0/0\s+0/1\s+0\s+closed$`, b.ok(t, "pools", "reset-breaker", "h100", "--reason", "fixed the PDU"))
	require.Equal(t, "fixed the PDU", hf.last().(*apiv1.ResetBreakerRequest).GetReason())

	// Remediations.
	out = b.ok(t, "remediations", "list", "--node", "gpu-1", "--state", "running")
	require.Regexp(t, `(?m)^gpu-1\s+hrm_1\s+reset\s+running\s+GPU-aaa\s`, out)
	lr := hf.last().(*apiv1.ListRemediationsRequest)
	require.Equal(t, "gpu-1", lr.GetNode())
	require.Equal(t, "running", lr.GetState())
	require.True(t, strings.Contains(b.ok(t, "remediations", "list", "-o", "json"), `"wfl_1"`))
}
