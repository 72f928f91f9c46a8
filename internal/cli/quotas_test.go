package cli

import (
	"context"
	"encoding/json"
	"fmt"
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

// quotaFake is an in-memory QuotaService that records what it was asked.
type quotaFake struct {
	f *fake

	mu     sync.Mutex
	quotas []*apiv1.Quota
	sets   []*apiv1.SetQuotaRequest
	lists  []*apiv1.ListQuotasRequest
}

func setupQuotas(t *testing.T) (*bundle, *quotaFake) {
	t.Helper()
	qf := &quotaFake{f: newFake(), quotas: []*apiv1.Quota{
		{Id: "quo_1", TenantId: "ten_1", Gpus: 8, GpuHours: -1, GpusUsed: 3, GpuHoursUsed: 12.345, UpdateTime: created},
		{Id: "quo_2", TenantId: "ten_1", ProjectId: "prj_web", Model: "H100", PoolId: "pool_h100", Gpus: -1, GpuHours: 100, GpuHoursUsed: 0.5, UpdateTime: created},
		{Id: "quo_3", TenantId: "ten_1", ProjectId: "prj_batch", Gpus: 2, GpuHours: -1, UpdateTime: created},
	}}
	opt := connect.WithInterceptors(recorder{qf.f})
	mux := http.NewServeMux()
	mux.Handle(apiv1connect.NewIdentityServiceHandler(identitySvc{qf.f}, opt))
	mux.Handle(apiv1connect.NewQuotaServiceHandler(fakeQuotas{qf}, opt))
	mux.Handle(apiv1connect.NewTenantServiceHandler(fakeTenantNames{}, opt))
	mux.Handle(apiv1connect.NewProjectServiceHandler(fakeProjectNames{}, opt))
	mux.Handle(apiv1connect.NewPoolServiceHandler(fakePoolNames{}, opt))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	return &bundle{f: qf.f, srv: srv, cfgPath: filepath.Join(dir, "cfg", "config.yaml"), env: map[string]string{"HOME": dir}}, qf
}

type fakeQuotas struct{ qf *quotaFake }

func (s fakeQuotas) Set(_ context.Context, req *connect.Request[apiv1.SetQuotaRequest]) (*connect.Response[apiv1.SetQuotaResponse], error) {
	s.qf.mu.Lock()
	defer s.qf.mu.Unlock()
	m := req.Msg
	s.qf.sets = append(s.qf.sets, m)
	if m.GetTenant() == "" {
		return nil, apiError(connect.CodeInvalidArgument, "INVALID_ARGUMENT", "invalid tenant: is required", "",
			&apiv1.FieldViolation{Field: "tenant", Reason: "is required"})
	}
	q := &apiv1.Quota{Id: fmt.Sprintf("quo_new%d", len(s.qf.sets)), TenantId: "ten_1", ProjectId: m.GetProject(),
		Model: strings.ToUpper(m.GetModel()), PoolId: m.GetPool(), Gpus: -1, GpuHours: -1, UpdateTime: created}
	if m.Gpus != nil {
		q.Gpus = m.GetGpus()
	}
	if m.GpuHours != nil {
		q.GpuHours = m.GetGpuHours()
	}
	return connect.NewResponse(&apiv1.SetQuotaResponse{Quota: q}), nil
}

func (s fakeQuotas) Get(_ context.Context, req *connect.Request[apiv1.GetQuotaRequest]) (*connect.Response[apiv1.GetQuotaResponse], error) {
	s.qf.mu.Lock()
	defer s.qf.mu.Unlock()
	for _, q := range s.qf.quotas {
		if q.GetId() == req.Msg.GetQuota() {
			return connect.NewResponse(&apiv1.GetQuotaResponse{Quota: q}), nil
		}
	}
	return nil, apiError(connect.CodeNotFound, "NOT_FOUND", fmt.Sprintf("quota %q not found", req.Msg.GetQuota()), "")
}

func (s fakeQuotas) List(_ context.Context, req *connect.Request[apiv1.ListQuotasRequest]) (*connect.Response[apiv1.ListQuotasResponse], error) {
	s.qf.mu.Lock()
	defer s.qf.mu.Unlock()
	s.qf.lists = append(s.qf.lists, req.Msg)
	items, next := page(s.qf.f, s.qf.quotas, req.Msg.GetPageToken(), req.Msg.GetPageSize())
	return connect.NewResponse(&apiv1.ListQuotasResponse{Quotas: items, NextPageToken: next}), nil
}

func TestQuotasCLI(t *testing.T) {
	t.Parallel()
	b, qf := setupQuotas(t)

	// Limits are sent only when given: a flag left out is unlimited.
	out := b.ok(t, "quotas", "set", "--tenant", "acme", "--project", "web", "--model", "h100", "--pool", "h100", "--gpus", "0")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	require.Regexp(t, `^ID\s+TENANT\s+SCOPE\s+GPUS\s+GPU-HOURS\s+UPDATED$`, lines[0])
	require.Regexp(t, `^quo_new1\s+acme\s+project/web/model=H100/pool=h100\s+0/0\s+0/unlimited\s+2025-01-02T03:04:05Z$`, lines[1])
	b.ok(t, "quotas", "set", "--tenant", "acme", "--gpu-hours", "12.5")
	qf.mu.Lock()
	first, second := qf.sets[0], qf.sets[1]
	qf.mu.Unlock()
	require.Equal(t, "acme", first.GetTenant())
	require.Equal(t, "web", first.GetProject())
	require.Equal(t, "h100", first.GetModel(), "the server normalizes the model")
	require.Equal(t, "h100", first.GetPool())
	require.NotNil(t, first.Gpus)
	require.Zero(t, first.GetGpus())
	require.Nil(t, first.GpuHours)
	require.Nil(t, second.Gpus)
	require.InDelta(t, 12.5, second.GetGpuHours(), 1e-12)
	// Set is no create: it carries no Idempotency-Key (it is safe to repeat).
	require.Empty(t, b.f.callsTo("QuotaService/Set")[0].header.Get("Idempotency-Key"))

	// The tenant comes from the flag, the context or the token: the fake's
	// token is a platform admin's, so set needs --tenant and list does not.
	r := b.run(t, "", "quotas", "set", "--gpus", "1")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "tenant")

	out = b.ok(t, "quotas", "list")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, "every page is followed")
	// Tenants, projects and pools by name, not id.
	require.Regexp(t, `^quo_1\s+acme\s+tenant\s+3/8\s+12.35/unlimited\s+`, lines[1])
	require.Regexp(t, `^quo_2\s+acme\s+project/web/model=H100/pool=h100\s+0/unlimited\s+0.5/100\s+`, lines[2])
	qf.mu.Lock()
	require.Empty(t, qf.lists[0].GetTenant())
	qf.mu.Unlock()

	b.ok(t, "quotas", "list", "--tenant", "acme", "--project", "web", "--limit", "1")
	qf.mu.Lock()
	last := qf.lists[len(qf.lists)-1]
	qf.mu.Unlock()
	require.Equal(t, "acme", last.GetTenant())
	require.Equal(t, "web", last.GetProject())
	require.Equal(t, int32(1), last.GetPageSize())
	// A project is named within a tenant.
	r = b.run(t, "", "quotas", "list", "--project", "web")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "tenant")

	var got struct {
		Quota struct {
			Id           string  `json:"id"`
			Gpus         int32   `json:"gpus"`
			GpuHours     float64 `json:"gpuHours"`
			GpuHoursUsed float64 `json:"gpuHoursUsed"`
		} `json:"quota"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "quotas", "get", "quo_2", "--tenant", "acme", "-o", "json")), &got))
	require.Equal(t, "quo_2", got.Quota.Id)
	require.Equal(t, int32(-1), got.Quota.Gpus)
	require.InDelta(t, 100.0, got.Quota.GpuHours, 1e-12)
	require.InDelta(t, 0.5, got.Quota.GpuHoursUsed, 1e-12)

	r = b.run(t, "", "quotas", "get", "quo_9", "--tenant", "acme")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "NOT_FOUND")
	r = b.run(t, "", "quotas", "get", "--tenant", "acme")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "QUOTA: required")
}
