package app_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
)

func TestTourAcceptance(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()

	events := make(chan *apiv1.Event, 16)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		// From the start of the log: the watch may connect after the first
		// mutations commit.
		_ = admin.Watch(watchCtx, &apiv1.WatchEventsRequest{After: "0"}, func(ev *apiv1.Event) error {
			events <- ev
			return nil
		})
	}()

	tres, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	require.Equal(t, "acme", tres.Msg.GetTenant().GetName())

	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
	require.NoError(t, err)

	kres, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "member"}))
	require.NoError(t, err)
	require.Contains(t, kres.Msg.GetSecret(), "bc_")

	member := cp.Client(kres.Msg.GetSecret())
	who, err := member.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
	require.Equal(t, "acme", who.Msg.GetTenantName())
	require.Equal(t, "member", who.Msg.GetRole())

	_, err = member.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "other", Name: "x"}))
	require.Error(t, err)
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))

	_, err = member.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "api"}))
	require.NoError(t, err)

	aud, err := admin.Audit.List(ctx, connect.NewRequest(&apiv1.ListAuditRequest{}))
	require.NoError(t, err)
	var got []string
	for _, e := range aud.Msg.GetEntries() {
		got = append(got, e.GetAction()+":"+e.GetDecision())
	}
	require.Equal(t, []string{"projects.create:allow", "projects.create:deny", "apiKeys.create:allow",
		"projects.create:allow", "tenants.create:allow", "apiKeys.create:allow"}, got)

	var types []string
	next := func() string {
		return bctest.Receive(t, fmt.Sprintf("the next event after %v", types), events).GetType()
	}
	for len(types) < 5 {
		types = append(types, next())
	}
	require.Equal(t, []string{"platform.bootstrapped", "tenant.created", "project.created", "apikey.created", "project.created"}, types)

	// Live: a mutation after the backlog arrives on the open stream.
	_, err = admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "later"}))
	require.NoError(t, err)
	require.Equal(t, "tenant.created", next())
}

// TestGRPCAndConnectJSON: the same handlers answer gRPC (HTTP/2 without TLS)
// and Connect JSON over HTTP/1.1, as curl sends it.
func TestGRPCAndConnectJSON(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()

	h2c := &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return p
	}()}}
	grpc := client.New(cp.URL, cp.AdminKey, client.WithGRPC(), client.WithHTTPClient(h2c))
	who, err := grpc.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
	require.Equal(t, "platform-admin", who.Msg.GetRole())
	_, err = grpc.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "Bad Name"}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cp.URL+"/bettercompute.api.v1.TenantService/Create", strings.NewReader(`{"name":"acme"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+cp.AdminKey)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, string(body))
	require.Contains(t, string(body), `"name":"acme"`)
	require.NotEmpty(t, res.Header.Get("X-Request-Id"))
}

// TestDownloads: the install script's bcd download is served from the
// downloads dir with its sha256 beside it; anything else is not found.
func TestDownloads(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bcd", "v0.1.0"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bcd", "v0.1.0", "linux-amd64"), []byte("ELF"), 0o644))
	cp := bctest.NewControlPlane(t, func(c *app.Config) { c.DownloadsDir = dir })
	get := func(path string) (int, string) {
		res, err := http.Get(cp.URL + path)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	code, body := get("/downloads/bcd/v0.1.0/linux-amd64")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ELF", body)
	for _, p := range []string{"/downloads/bcd/v0.1.0/linux-arm64", "/downloads/bcd/../secret", "/downloads/bcd/v0.1.0/linux-amd64.exe"} {
		code, _ := get(p)
		require.Equal(t, http.StatusNotFound, code, p)
	}
}
