package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
)

// rolloutsFake answers the rollout API with one rollout and keeps the
// requests it got.
type rolloutsFake struct {
	apiv1connect.UnimplementedRolloutServiceHandler
	mu   sync.Mutex
	reqs []any
}

func (h *rolloutsFake) got(req any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reqs = append(h.reqs, req)
}

func (h *rolloutsFake) last() any {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reqs[len(h.reqs)-1]
}

var fakeRollout = &apiv1.Rollout{Id: "rol_1", Release: "v1.1.0", PoolId: "pol_1", Pool: "h100", Waves: []string{"1", "100%"},
	WaveNodes: []int32{1, 1}, MaxUnavailable: 1, State: "halted", Message: "node gpu-1: not back", CreateTime: created,
	NodeStates: map[string]int32{"failed": 1, "pending": 1},
	Nodes: []*apiv1.RolloutNode{{NodeId: "nod_1", Node: "gpu-1", Wave: 0, FromVersion: "v1.0.0", State: "failed", CommandId: "cmd_1",
		RollbackCommandId: "cmd_2"}, {NodeId: "nod_2", Node: "gpu-2", Wave: 1, FromVersion: "v1.0.0", State: "pending"}}}

func (h *rolloutsFake) Create(_ context.Context, req *connect.Request[apiv1.CreateRolloutRequest]) (*connect.Response[apiv1.CreateRolloutResponse], error) {
	h.got(req.Msg)
	return connect.NewResponse(&apiv1.CreateRolloutResponse{Rollout: fakeRollout}), nil
}

func (h *rolloutsFake) Get(_ context.Context, req *connect.Request[apiv1.GetRolloutRequest]) (*connect.Response[apiv1.GetRolloutResponse], error) {
	h.got(req.Msg)
	return connect.NewResponse(&apiv1.GetRolloutResponse{Rollout: fakeRollout}), nil
}

func (h *rolloutsFake) List(_ context.Context, req *connect.Request[apiv1.ListRolloutsRequest]) (*connect.Response[apiv1.ListRolloutsResponse], error) {
	h.got(req.Msg)
	return connect.NewResponse(&apiv1.ListRolloutsResponse{Rollouts: []*apiv1.Rollout{fakeRollout}}), nil
}

func (h *rolloutsFake) Abort(_ context.Context, req *connect.Request[apiv1.AbortRolloutRequest]) (*connect.Response[apiv1.AbortRolloutResponse], error) {
	h.got(req.Msg)
	return connect.NewResponse(&apiv1.AbortRolloutResponse{Rollout: fakeRollout}), nil
}

func TestRolloutsCLI(t *testing.T) {
	t.Parallel()
	f := newFake()
	rf := &rolloutsFake{}
	opt := connect.WithInterceptors(recorder{f})
	mux := http.NewServeMux()
	mux.Handle(apiv1connect.NewIdentityServiceHandler(identitySvc{f}, opt))
	mux.Handle(apiv1connect.NewRolloutServiceHandler(rf, opt))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	b := &bundle{f: f, srv: srv, cfgPath: filepath.Join(dir, "cfg", "config.yaml"), env: map[string]string{"HOME": dir}}

	out := b.ok(t, "rollouts", "create", "--release", "v1.1.0", "--pool", "h100", "--waves", "1, 10%,50%,100%",
		"--max-unavailable", "3", "--pause-between", "10m", "--soak", "90s")
	req := rf.last().(*apiv1.CreateRolloutRequest)
	require.Equal(t, []string{"1", "10%", "50%", "100%"}, req.GetWaves())
	require.Equal(t, int32(3), req.GetMaxUnavailable())
	require.Equal(t, 10*time.Minute, req.GetPauseBetween().AsDuration())
	require.Equal(t, 90*time.Second, req.GetSoak().AsDuration())
	require.Nil(t, req.GetRevertAfter(), "an unset flag leaves the server's default")
	require.Regexp(t, `(?m)^rol_1\s+v1\.1\.0\s+h100\s+halted\s+1/2\s+1,100%\s+failed=1 pending=1\s`, out)
	require.Regexp(t, `(?m)^gpu-1\s+1\s+v1\.0\.0\s+failed\s+cmd_1\s+cmd_2\s+-$`, out)
	require.Contains(t, out, "node gpu-1: not back")

	b.ok(t, "rollouts", "list", "--pool", "h100", "--state", "halted")
	require.Equal(t, "halted", rf.last().(*apiv1.ListRolloutsRequest).GetState())
	b.ok(t, "rollouts", "get", "rol_1")
	require.Equal(t, "rol_1", rf.last().(*apiv1.GetRolloutRequest).GetId())
	b.ok(t, "rollouts", "abort", "rol_1")
	require.Equal(t, "rol_1", rf.last().(*apiv1.AbortRolloutRequest).GetId())
}
