package bctest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/client"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
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
	// GatewayAddr is the agent gateway's host:port on loopback ("" when the
	// gateway role is not run); agents verify it with PKI.TrustBundlePEM.
	GatewayAddr string
	// ReplicaURL is the replica listener other replicas forward to
	// (https://, mutual TLS); "" on SQLite, where nothing is forwarded.
	ReplicaURL string
	// PKI is the control plane's certificate authority.
	PKI *pki.Authority
	// Secret is the generated BETTER_COMPUTE_SECRET sealing the PKI.
	Secret string

	storeCfg store.Config
	// imagesDir is the image blob directory, shared by replicas as
	// deployments of several replicas must share it.
	imagesDir string
	stop      func()
	// appName tags this replica's PostgreSQL sessions, so Kill can end
	// them.
	appName string
}

// ControlPlaneOption adjusts the app config before it is built.
type ControlPlaneOption func(*app.Config)

// WorkloadIssuer is the iss of a test control plane's workload tokens.
const WorkloadIssuer = "https://control-plane.bctest.example"

// NewControlPlane starts a control plane with the api, worker and gateway
// roles (the gateway on 127.0.0.1:0 with a fresh PKI) and a bootstrapped
// platform admin key.
func NewControlPlane(t testing.TB, opts ...ControlPlaneOption) *ControlPlane {
	t.Helper()
	clk := NewSimClock(time.Now())
	storeCfg := NewStoreConfig(t, clk)
	secret, err := pki.GenerateSecret()
	if err != nil {
		t.Fatalf("bctest: generate secret: %v", err)
	}
	cp := &ControlPlane{Clock: clk, Secret: secret, storeCfg: storeCfg, imagesDir: t.TempDir()}
	cp.start(t, opts, true)
	return cp
}

// NewReplica starts another replica of cp: its own app, API server and
// gateway on a new handle to the same database, with the same clock and
// secret (so the same PKI). It shares cp's admin key. Replicas wake each
// other's sessions only where the database can notify (PostgreSQL).
func (cp *ControlPlane) NewReplica(t testing.TB, opts ...ControlPlaneOption) *ControlPlane {
	t.Helper()
	r := &ControlPlane{Clock: cp.Clock, Secret: cp.Secret, AdminKey: cp.AdminKey, storeCfg: cp.storeCfg, imagesDir: cp.imagesDir}
	r.start(t, opts, false)
	return r
}

func (cp *ControlPlane) start(t testing.TB, opts []ControlPlaneOption, bootstrap bool) {
	t.Helper()
	scfg := cp.storeCfg
	if scfg.URL != "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		cp.appName = "bc-replica-" + hex.EncodeToString(b[:])
		sep := "?"
		if strings.Contains(scfg.URL, "?") {
			sep = "&"
		}
		scfg.URL += sep + "application_name=" + cp.appName
	}
	db := OpenDB(t, scfg)
	cfg := app.Config{
		Clock:         cp.Clock,
		Logger:        failureLog(t),
		EventPoll:     50 * time.Millisecond,
		JobPoll:       50 * time.Millisecond,
		Secret:        cp.Secret,
		GatewayListen: "127.0.0.1:0",
		ReplicaListen: "127.0.0.1:0",
		ImagesDir:     cp.imagesDir,
		// Test receivers listen on loopback, as in dev.
		WebhookAllowLoopback: true,
		// Workload identity on; verifiers fetch its documents from cp.URL.
		WorkloadIssuer: WorkloadIssuer,
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
	cp.PKI = a.PKI
	if bootstrap {
		if cp.AdminKey, _, err = a.Bootstrap(ctx, nil); err != nil {
			cancel()
			t.Fatalf("bctest: bootstrap: %v", err)
		}
	}
	srv := httptest.NewUnstartedServer(a.Handler)
	// gRPC clients speak HTTP/2 without TLS (h2c), as to `serve`.
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	cp.URL = srv.URL
	a.SetAPIURL(srv.URL)
	a.SetSelfURL(srv.URL)
	// Peers forward to the replica listener (PostgreSQL only), over mutual
	// TLS with the internal CA's certificates, as in serve.
	replicaAddr, err := a.ListenReplica()
	if err != nil {
		cancel()
		t.Fatalf("bctest: replica listener: %v", err)
	}
	if replicaAddr != nil {
		cp.ReplicaURL = "https://" + replicaAddr.String()
		a.SetAPIURL(cp.ReplicaURL)
		if err := a.EnableReplicaTunnels(ctx, cp.ReplicaURL); err != nil {
			cancel()
			t.Fatalf("bctest: replica tunnels: %v", err)
		}
	}
	replicaDone := make(chan error, 1)
	go func() { replicaDone <- a.ServeReplica(ctx) }()
	done := make(chan error, 1)
	go func() { done <- a.Jobs.Run(ctx) }()
	whDone := make(chan error, 1)
	go func() { whDone <- a.RunWebhooks(ctx) }()
	gwDone := make(chan error, 1)
	if len(cfg.Roles) == 0 || slices.Contains(cfg.Roles, app.RoleGateway) {
		addr, err := a.ListenGateway()
		if err != nil {
			cancel()
			t.Fatalf("bctest: gateway: %v", err)
		}
		cp.GatewayAddr = addr.String()
		go func() { gwDone <- a.Gateway.Run(ctx) }()
	} else {
		gwDone <- nil
	}
	var once sync.Once
	cp.stop = func() {
		once.Do(func() {
			srv.Close()
			cancel()
			a.Stop()
			if err := <-gwDone; err != nil {
				t.Errorf("bctest: gateway: %v", err)
			}
			if err := <-replicaDone; err != nil {
				t.Errorf("bctest: replica listener: %v", err)
			}
			if err := <-done; err != nil {
				t.Errorf("bctest: jobs: %v", err)
			}
			if err := <-whDone; err != nil {
				t.Errorf("bctest: webhooks: %v", err)
			}
		})
	}
	t.Cleanup(cp.stop)
}

// Kill stops the replica as a crash would: its API, jobs and placers stop,
// and every database session it holds is ended on the server — a
// transaction in flight is cut off before it commits, and the session
// advisory locks it held (its pools' placers) are released. PostgreSQL
// only: SQLite has one process. Requests in flight at it get errors.
func (cp *ControlPlane) Kill(t testing.TB) {
	t.Helper()
	if cp.appName == "" {
		t.Fatalf("bctest: Kill needs PostgreSQL")
	}
	cp.App.Capacity.Engine.Stop()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, cp.storeCfg.URL)
	if err != nil {
		t.Fatalf("bctest: kill: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, cp.appName); err != nil {
		t.Fatalf("bctest: kill: %v", err)
	}
	cp.stop()
}

// Client returns an API client authenticating with token.
func (cp *ControlPlane) Client(token string) *client.Client {
	return client.New(cp.URL, token)
}

// Admin returns a client with the platform admin key.
func (cp *ControlPlane) Admin() *client.Client { return cp.Client(cp.AdminKey) }

// failureLog keeps the control plane's warnings and errors and prints the
// last of them if the test fails: an error a client sees only as
// "internal error; retry later" is logged with its cause here.
func failureLog(t testing.TB) *slog.Logger {
	buf := &tailBuffer{max: 16 << 10}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane warnings and errors (the last %d KiB):\n%s", buf.max>>10, buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// tailBuffer keeps the last max bytes written to it, for many writers.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if over := len(w.b) - w.max; over > 0 {
		w.b = append(w.b[:0], w.b[over:]...)
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}
