package iam

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakePDP is a real AuthZEN evaluation endpoint: it checks the request the
// way a strict PDP would and decides with a rule the test supplies.
type fakePDP struct {
	decide func(req authzenRequest) (int, string) // status, body

	mu       sync.Mutex
	last     authzenRequest
	lastAuth string
}

func (f *fakePDP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "method", http.StatusMethodNotAllowed)
		return
	}
	if r.URL.Path != "/access/v1/evaluation" {
		http.NotFound(w, r)
		return
	}
	if r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, "content type", http.StatusUnsupportedMediaType)
		return
	}
	var req authzenRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Subject.Type == "" || req.Action.Name == "" || req.Resource.Type == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.last, f.lastAuth = req, r.Header.Get("Authorization")
	f.mu.Unlock()
	status, body := f.decide(req)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

func setupPDP(t *testing.T, decide func(authzenRequest) (int, string), cfg AuthZENConfig) (*AuthZEN, *fakePDP) {
	t.Helper()
	f := &fakePDP{decide: decide}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	cfg.URL = srv.URL + "/"
	cfg.Client = srv.Client()
	return NewAuthZEN(cfg), f
}

func TestAuthZEN(t *testing.T) {
	t.Parallel()
	// The rule: members may do anything in their own tenant; agents deleting
	// need a human.
	rule := func(req authzenRequest) (int, string) {
		if req.Subject.Type == "agent" && req.Action.Name == "projects.delete" && req.Context["confirmed"] != true {
			return 200, `{"decision": false, "context": {"confirmation_required": true}}`
		}
		if req.Subject.Properties["tenant"] == req.Resource.Properties["tenant"] {
			return 200, `{"decision": true}`
		}
		return 200, `{"decision": false, "context": {"reason_admin": {"en": "cross-tenant"}}}`
	}
	tests := []struct {
		name   string
		decide func(authzenRequest) (int, string)
		cfg    AuthZENConfig
		req    Request
		want   Decision
		errIn  string
	}{
		{"allow", rule, AuthZENConfig{}, Request{Principal: principals[RoleMember], Action: "projects.create", Resource: resourceFor("projects.create", "t1")},
			Decision{Allowed: true}, ""},
		{"deny", rule, AuthZENConfig{}, Request{Principal: principals[RoleMember], Action: "projects.get", Resource: resourceFor("projects.get", "t2")},
			Decision{Reasons: []string{`{"en":"cross-tenant"}`}}, ""},
		{"confirmation required", rule, AuthZENConfig{}, Request{Principal: principals[RoleAgent], Action: "projects.delete", Resource: resourceFor("projects.delete", "t1")},
			Decision{ConfirmationRequired: true}, ""},
		{"confirmed", rule, AuthZENConfig{}, Request{Principal: principals[RoleAgent], Action: "projects.delete", Resource: resourceFor("projects.delete", "t1"), Context: map[string]any{"confirmed": true}},
			Decision{Allowed: true}, ""},
		{"server error", func(authzenRequest) (int, string) { return 500, `{"decision": true}` }, AuthZENConfig{},
			Request{Principal: principals[RoleMember], Action: "projects.get", Resource: resourceFor("projects.get", "t1")}, Decision{}, "500"},
		{"garbage body", func(authzenRequest) (int, string) { return 200, `<html>allowed</html>` }, AuthZENConfig{},
			Request{Principal: principals[RoleMember], Action: "projects.get", Resource: resourceFor("projects.get", "t1")}, Decision{}, "decode"},
		{"no decision", func(authzenRequest) (int, string) { return 200, `{"context": {}}` }, AuthZENConfig{},
			Request{Principal: principals[RoleMember], Action: "projects.get", Resource: resourceFor("projects.get", "t1")}, Decision{}, "no decision"},
		{"timeout", func(authzenRequest) (int, string) {
			time.Sleep(300 * time.Millisecond)
			return 200, `{"decision": true}`
		},
			AuthZENConfig{Timeout: 50 * time.Millisecond},
			Request{Principal: principals[RoleMember], Action: "projects.get", Resource: resourceFor("projects.get", "t1")}, Decision{}, "deadline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, _ := setupPDP(t, tt.decide, tt.cfg)
			got, err := a.Authorize(context.Background(), tt.req)
			if tt.errIn != "" {
				require.ErrorIs(t, err, ErrPDP)
				require.ErrorContains(t, err, tt.errIn)
				require.False(t, got.Allowed, "fail closed")
				require.False(t, got.ConfirmationRequired)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestAuthZENRequestShape(t *testing.T) {
	t.Parallel()
	a, f := setupPDP(t, func(authzenRequest) (int, string) { return 200, `{"decision": true}` }, AuthZENConfig{Token: "s3cret"})
	_, err := a.Authorize(context.Background(), Request{
		Principal: principals[RoleAgent],
		Action:    "apiKeys.create",
		Resource:  Resource{Type: "ApiKey", TenantID: "t1", ProjectID: "p1", Attrs: map[string]any{"scopes": []string{"read"}, "tenant": "spoof"}},
		Context:   map[string]any{"ip": "10.0.0.1"},
	})
	require.NoError(t, err)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Equal(t, "Bearer s3cret", f.lastAuth)
	require.Equal(t, authzenEntity{Type: "agent", ID: "claude", Properties: map[string]any{"role": "agent", "tenant": "t1"}}, f.last.Subject)
	require.Equal(t, "apiKeys.create", f.last.Action.Name)
	require.Equal(t, authzenEntity{Type: "ApiKey", ID: DraftID, Properties: map[string]any{
		"tenant": "t1", "project": "p1", "scopes": []any{"read"},
	}}, f.last.Resource)
	require.Equal(t, map[string]any{"confirmed": false, "ip": "10.0.0.1"}, f.last.Context)
}

func TestAuthZENUnreachable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now
	got, err := NewAuthZEN(AuthZENConfig{URL: url}).Authorize(context.Background(), Request{
		Principal: principals[RolePlatformAdmin], Action: "tenants.list", Resource: resourceFor("tenants.list", ""),
	})
	require.ErrorIs(t, err, ErrPDP)
	require.False(t, got.Allowed)
}

func TestAuthZENNoToken(t *testing.T) {
	t.Parallel()
	a, f := setupPDP(t, func(authzenRequest) (int, string) { return 200, `{"decision": false}` }, AuthZENConfig{})
	got, err := a.Authorize(context.Background(), Request{Principal: principals[RoleViewer], Action: "tenants.get", Resource: resourceFor("tenants.get", "t1")})
	require.NoError(t, err)
	require.Equal(t, Decision{}, got)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Empty(t, f.lastAuth)
}
