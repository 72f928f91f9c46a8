package app_test

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// A refusal names the principal, the action and the resource it was decided
// on; another tenant is named only as the request named it, so a stranger
// learns nothing about whether it, or anything in it, exists.
func TestRefusalNamesPrincipalActionResource(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	for _, name := range []string{"acme", "sim"} {
		_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
	}
	_, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "sim", Name: "web"}))
	require.NoError(t, err)
	key := func(role string) (*client.Client, string) {
		res, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		return cp.Client(res.Msg.GetSecret()), res.Msg.GetApiKey().GetId()
	}
	member, memberID := key("member")
	viewer, viewerID := key("viewer")

	refused := func(err error) string {
		t.Helper()
		require.Error(t, err)
		require.Equal(t, "PERMISSION_DENIED", client.Code(err))
		var ce *connect.Error
		require.True(t, errors.As(err, &ce))
		return ce.Message()
	}
	m := "key " + memberID + " (member of acme) may not "

	_, err = member.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: "sim"}))
	require.Equal(t, m+"projects.list on tenant sim", refused(err))
	_, err = member.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: "nope"}))
	require.Equal(t, m+"projects.list on tenant nope", refused(err), "a missing tenant reads like a foreign one")

	_, err = member.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "sim", Project: "web"}))
	require.Equal(t, m+"projects.get on a project in tenant sim", refused(err))
	_, err = member.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "sim", Project: "nope"}))
	require.Equal(t, m+"projects.get on a project in tenant sim", refused(err), "a missing project reads like an existing one")

	_, err = member.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "sim", Name: "x"}))
	require.Equal(t, m+"projects.create on a new project in tenant sim", refused(err))

	// In the caller's own tenant, the tenant is named by its name even when
	// the request used its id.
	_, err = viewer.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "x"}))
	require.Equal(t, "key "+viewerID+" (viewer of acme) may not projects.create on a new project in tenant acme", refused(err))

	_, err = member.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "mine"}))
	require.Equal(t, m+"tenants.create on a new tenant mine", refused(err))
}
