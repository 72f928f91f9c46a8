package usage_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// TestUsageHonoursProjectForbid: a policy forbidding project ml hides its
// windows from List and Export (closed hours and the open one), and a
// request naming ml is refused, as reads of ml are elsewhere.
func TestUsageHonoursProjectForbid(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()
	_, err := f.admin.Policies.Put(ctx, connect.NewRequest(&apiv1.PutPolicyRequest{Tenant: "acme", Id: "hide-ml",
		Text: fmt.Sprintf(`@id("hide-ml")
forbid (principal, action in BC::Action::"read", resource in BC::Project::%q);`, f.ml)}))
	require.NoError(t, err)

	var windows []*apiv1.UsageWindow
	token := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		res, err := f.viewer.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", PageSize: 4, PageToken: token}))
		require.NoError(t, err)
		windows = append(windows, res.Msg.GetWindows()...)
		if token = res.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	require.Len(t, windows, 9, "web's three metrics over three hours; nothing of ml, open or closed")
	for _, w := range windows {
		require.Equal(t, f.web, w.GetProjectId())
	}
	_, err = f.viewer.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", Project: "ml"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))

	res, err := f.viewer.Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: "acme", Format: "csv"}))
	require.NoError(t, err)
	records, err := csv.NewReader(bytes.NewReader(res.Msg.GetData())).ReadAll()
	require.NoError(t, err)
	require.Len(t, records, 9+1, "the header and web's windows")
	_, err = f.viewer.Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: "acme", Project: "ml"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))

	// The platform admin is not bound by the tenant's policies.
	all, err := f.admin.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, all.Msg.GetWindows(), f.acmeWindowsTotal+1)
}
