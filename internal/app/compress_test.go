package app_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/app"
)

// A small response goes out as it is even to a caller that accepts gzip:
// compressing it costs more CPU than it saves. A large one is compressed.
func TestSmallResponsesAreNotCompressed(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := t.Context()
	_, err := cp.Admin().Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)

	list := func(t *testing.T) (encoding string, size int) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, cp.URL+apiv1connect.ProjectServiceListProcedure, strings.NewReader(`{"tenant":"acme"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+cp.AdminKey)
		// Set by hand, so the transport hands the body over as sent.
		req.Header.Set("Accept-Encoding", "gzip")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		raw, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode, "%s", raw)
		return res.Header.Get("Content-Encoding"), len(raw)
	}

	enc, size := list(t)
	require.Empty(t, enc, "an empty list (%d bytes) goes out uncompressed", size)

	for i := range 40 {
		_, err := cp.Admin().Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme",
			Name: fmt.Sprintf("project-%02d", i), DisplayName: strings.Repeat("a project with a long display name ", 2)}))
		require.NoError(t, err)
	}
	enc, size = list(t)
	require.Equal(t, "gzip", enc, "a list of forty projects is compressed")
	require.Less(t, size, app.CompressMinBytes*4, "and smaller for it")
}
