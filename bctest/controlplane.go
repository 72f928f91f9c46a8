package bctest

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/better-compute/better-compute/client"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/iam"
)

// ControlPlane is a whole control plane for one test: the real app on a
// throw-away store (SQLite, or PostgreSQL with BC_TEST_POSTGRES_URL), its API
// served over loopback HTTP, a settable clock, and an authorizer that counts
// its calls.
type ControlPlane struct {
	App      *app.App
	URL      string
	AdminKey string
	Clock    *SimClock
	Authz    *iam.Counting
}

// ControlPlaneOption adjusts the app config before it is built.
type ControlPlaneOption func(*app.Config)

// NewControlPlane starts a control plane with the api and worker roles and a
// bootstrapped platform admin key.
func NewControlPlane(t testing.TB, opts ...ControlPlaneOption) *ControlPlane {
	t.Helper()
	clk := NewSimClock(time.Now())
	db := NewDB(t, clk)
	cp := &ControlPlane{Clock: clk}
	cfg := app.Config{
		Clock:     clk,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		EventPoll: 50 * time.Millisecond,
		JobPoll:   50 * time.Millisecond,
		WrapAuthorizer: func(inner iam.Authorizer) iam.Authorizer {
			cp.Authz = iam.NewCounting(inner)
			return cp.Authz
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.NewWithDB(ctx, cfg, db)
	if err != nil {
		cancel()
		t.Fatalf("bctest: build control plane: %v", err)
	}
	cp.App = a
	if cp.AdminKey, _, err = a.Bootstrap(ctx, nil); err != nil {
		cancel()
		t.Fatalf("bctest: bootstrap: %v", err)
	}
	srv := httptest.NewUnstartedServer(a.Handler)
	// gRPC clients speak HTTP/2 without TLS (h2c), as to `serve`.
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	cp.URL = srv.URL
	done := make(chan error, 1)
	go func() { done <- a.Jobs.Run(ctx) }()
	t.Cleanup(func() {
		srv.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("bctest: jobs: %v", err)
		}
	})
	return cp
}

// Client returns an API client authenticating with token.
func (cp *ControlPlane) Client(token string) *client.Client {
	return client.New(cp.URL, token)
}

// Admin returns a client with the platform admin key.
func (cp *ControlPlane) Admin() *client.Client { return cp.Client(cp.AdminKey) }
