package app_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// azPDP is an AuthZEN PDP that allows everything except projects.delete and
// records what it was asked.
type azPDP struct {
	mu       sync.Mutex
	requests []azRequest
}

type azRequest struct {
	Subject struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	} `json:"subject"`
	Action struct {
		Name string `json:"name"`
	} `json:"action"`
	Resource struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	} `json:"resource"`
	Context map[string]any `json:"context"`
}

func (p *azPDP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/access/v1/evaluation" {
		http.NotFound(w, r)
		return
	}
	var req azRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.requests = append(p.requests, req)
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"decision": req.Action.Name != "projects.delete"})
}

func (p *azPDP) last() azRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests[len(p.requests)-1]
}

func TestAuthZENRemotePDP(t *testing.T) {
	t.Parallel()
	pdp := &azPDP{}
	srv := httptest.NewServer(pdp)
	t.Cleanup(srv.Close)
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.PDP = "authzen"
		c.AuthZENURL = srv.URL
	})
	ctx := context.Background()
	admin := cp.Admin()

	// Allowed by the remote PDP.
	cp.Authz.Reset()
	tnt := sfTenant(t, admin, "acme")
	require.Equal(t, 1, cp.Authz.CallsFor("tenants.create"))
	require.Equal(t, "tenants.create", pdp.last().Action.Name)
	prj := sfProject(t, admin, "acme", "web")
	last := pdp.last()
	require.Equal(t, "projects.create", last.Action.Name)
	require.NotEmpty(t, last.Subject.ID)
	require.NotEmpty(t, last.Resource.Type)

	// Denied by the remote PDP: one decision, one audit row, project kept.
	before := sfCounts(t, cp)
	cp.Authz.Reset()
	_, err := admin.Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "web"}))
	sfRequireCode(t, err, "PERMISSION_DENIED")
	require.Equal(t, 1, cp.Authz.CallsFor("projects.delete"))
	require.Equal(t, "projects.delete", pdp.last().Action.Name)
	sfRequireDelta(t, before, sfCounts(t, cp), map[string]int{"audit_log": 1})
	got, err := admin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: tnt.GetId(), Project: prj.GetId()}))
	require.NoError(t, err)
	require.Equal(t, "web", got.Msg.GetProject().GetName())

	// The PDP goes away: mutations fail closed and write only the
	// refusal's audit row.
	srv.Close()
	for _, name := range []string{"api", "db"} {
		before := sfCounts(t, cp)
		cp.Authz.Reset()
		_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: name}))
		sfRequireCode(t, err, "AUTHORIZATION_UNAVAILABLE")
		require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))
		require.Equal(t, 1, cp.Authz.CallsFor("projects.create"))
		sfRequireDelta(t, before, sfCounts(t, cp), map[string]int{"audit_log": 1})
	}
	var refusals int
	require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM audit_log WHERE action = 'projects.create' AND decision = $1 AND result = $2`,
			envelope.DecisionError, "AUTHORIZATION_UNAVAILABLE").Scan(&refusals)
	}))
	require.Equal(t, 2, refusals, "each refusal is on record with decision error")

	// A read the cache has not seen also fails closed.
	_, err = admin.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: "acme", NamePrefix: "w"}))
	sfRequireCode(t, err, "AUTHORIZATION_UNAVAILABLE")
}
