package app_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// listAllEvents pages through EventService.List and returns every event.
func listAllEvents(t *testing.T, c *client.Client, req *apiv1.ListEventsRequest) []*apiv1.Event {
	t.Helper()
	var out []*apiv1.Event
	for {
		resp, err := c.Events.List(t.Context(), connect.NewRequest(req))
		require.NoError(t, err)
		out = append(out, resp.Msg.GetEvents()...)
		if resp.Msg.GetNextPageToken() == "" {
			return out
		}
		req.PageToken = resp.Msg.GetNextPageToken()
	}
}

// TestEventsList: the outbox's events newest first, by filter and page, to a
// tenant's own keys (a viewer included) and never another tenant's.
func TestEventsList(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := cp.Admin()
	acme, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "rival"}))
	require.NoError(t, err)
	var projects []string
	for i := range 7 {
		cp.Clock.Advance(time.Minute)
		p, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: fmt.Sprintf("p%d", i)}))
		require.NoError(t, err)
		projects = append(projects, p.Msg.GetProject().GetId())
	}
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "rival", Name: "theirs"}))
	require.NoError(t, err)
	key := func(tenant, role string) *client.Client {
		k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role}))
		require.NoError(t, err)
		return cp.Client(k.Msg.GetSecret())
	}
	viewer, rival := key("acme", "viewer"), key("rival", "admin")
	// On PostgreSQL an event is listed once every older transaction in the
	// cluster has ended, and other packages' tests share the cluster: wait
	// for the rival's project, the last write above, to be past the horizon.
	bctest.WaitFor(t, "the setup's events", func() bool {
		resp, err := admin.Events.List(ctx, connect.NewRequest(&apiv1.ListEventsRequest{Tenant: "rival", TypePrefixes: []string{"project.created"}}))
		require.NoError(t, err)
		return len(resp.Msg.GetEvents()) == 1
	})

	// A viewer's key lists its own tenant by default, newest first.
	all := listAllEvents(t, viewer, &apiv1.ListEventsRequest{})
	var created []*apiv1.Event
	for _, ev := range all {
		require.Equal(t, acme.Msg.GetTenant().GetId(), ev.GetTenantId(), "%s", ev.GetType())
		if ev.GetType() == "project.created" {
			created = append(created, ev)
		}
	}
	require.Len(t, created, 7)
	for i, ev := range created {
		require.Equal(t, projects[6-i], ev.GetResourceId(), "newest first")
		require.Equal(t, "Project", ev.GetResourceType())
	}

	// Filters: type prefix, resource type and id.
	byType := listAllEvents(t, viewer, &apiv1.ListEventsRequest{TypePrefixes: []string{"project."}})
	require.Len(t, byType, 7)
	require.Empty(t, listAllEvents(t, viewer, &apiv1.ListEventsRequest{TypePrefixes: []string{"PROJECT."}}), "prefixes are case-sensitive")
	one := listAllEvents(t, viewer, &apiv1.ListEventsRequest{ResourceType: "Project", ResourceId: projects[3]})
	require.Len(t, one, 1)
	require.Equal(t, created[3].GetId(), one[0].GetId())

	// Pages of 3 give the same events, in the same order, with a token on
	// every page but the last.
	req := &apiv1.ListEventsRequest{Tenant: "acme", TypePrefixes: []string{"project."}, PageSize: 3}
	var paged []string
	pages := 0
	for {
		resp, err := viewer.Events.List(ctx, connect.NewRequest(req))
		require.NoError(t, err)
		pages++
		require.LessOrEqual(t, len(resp.Msg.GetEvents()), 3)
		for _, ev := range resp.Msg.GetEvents() {
			paged = append(paged, ev.GetId())
		}
		if resp.Msg.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.Msg.GetNextPageToken()
	}
	require.Equal(t, 3, pages)
	var want []string
	for _, ev := range created {
		want = append(want, ev.GetId())
	}
	require.Equal(t, want, paged)

	// A time range: since is inclusive, until exclusive.
	since, until := created[5].GetTime(), created[1].GetTime()
	ranged := listAllEvents(t, viewer, &apiv1.ListEventsRequest{TypePrefixes: []string{"project."}, Since: since, Until: until})
	var rangedIDs []string
	for _, ev := range ranged {
		rangedIDs = append(rangedIDs, ev.GetResourceId())
	}
	require.Equal(t, []string{projects[4], projects[3], projects[2], projects[1]}, rangedIDs)

	// A platform key lists every tenant, or one by name.
	everyone := listAllEvents(t, admin, &apiv1.ListEventsRequest{TypePrefixes: []string{"project.created"}})
	require.Len(t, everyone, 8)
	require.Len(t, listAllEvents(t, admin, &apiv1.ListEventsRequest{Tenant: "rival", TypePrefixes: []string{"project."}}), 1)

	// Another tenant's key sees only its own events and is refused acme's.
	for _, ev := range listAllEvents(t, rival, &apiv1.ListEventsRequest{}) {
		require.NotEqual(t, acme.Msg.GetTenant().GetId(), ev.GetTenantId())
	}
	_, err = rival.Events.List(ctx, connect.NewRequest(&apiv1.ListEventsRequest{Tenant: "acme"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%v", err)
	// acme's page token does not open acme's events to the rival.
	first, err := viewer.Events.List(ctx, connect.NewRequest(&apiv1.ListEventsRequest{PageSize: 1}))
	require.NoError(t, err)
	leaked, err := rival.Events.List(ctx, connect.NewRequest(&apiv1.ListEventsRequest{PageSize: 1, PageToken: first.Msg.GetNextPageToken()}))
	require.NoError(t, err)
	for _, ev := range leaked.Msg.GetEvents() {
		require.NotEqual(t, acme.Msg.GetTenant().GetId(), ev.GetTenantId())
	}

	// Bad input names its field.
	for field, bad := range map[string]*apiv1.ListEventsRequest{
		"page_token":    {PageToken: "not-a-token"},
		"page_size":     {PageSize: 501},
		"until":         {Since: until, Until: since},
		"type_prefixes": {TypePrefixes: make([]string, 33)},
		"tenant":        {Tenant: "Not A Name!"},
	} {
		_, err := viewer.Events.List(ctx, connect.NewRequest(bad))
		require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%s: %v", field, err)
		require.Contains(t, err.Error(), field)
	}
	// A token is bound to its filters.
	_, err = viewer.Events.List(ctx, connect.NewRequest(&apiv1.ListEventsRequest{ResourceType: "Project", PageToken: first.Msg.GetNextPageToken()}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%v", err)
	require.Contains(t, err.Error(), "page_token")
}
