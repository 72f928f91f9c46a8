package reservation_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// putPolicy stores a tenant policy of acme.
func (f *fixture) putPolicy(t *testing.T, id, text string) {
	t.Helper()
	_, err := f.admin.Policies.Put(context.Background(), connect.NewRequest(&apiv1.PutPolicyRequest{Tenant: "acme", Id: id, Text: text}))
	require.NoError(t, err)
}

// TestPreviewDecisionKeyedByRequest: a preview's read decision is not reused
// for a preview asking more. Before the read cache was keyed by resource
// attributes, the 1-GPU preview's allow answered the 16-GPU one.
func TestPreviewDecisionKeyedByRequest(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	f.putPolicy(t, "small-previews", `@id("small-previews")
forbid (principal, action == BC::Action::"reservations.preview", resource)
when { resource has gpus && resource.gpus > 8 };`)
	preview := func(gpus int32) error {
		_, err := f.member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{
			Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: gpus}}))
		return err
	}
	require.NoError(t, preview(1))
	err := preview(16)
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err), "%v", err)
	require.NoError(t, preview(1), "the small preview is still allowed")
}

// watched reads a watch until the created event of marker, returning the
// ids of the reservations it sent events for.
func watched(t *testing.T, stream *connect.ServerStreamForClient[apiv1.WatchReservationsResponse], marker string) []string {
	t.Helper()
	var ids []string
	for stream.Receive() {
		r := stream.Msg().GetReservation()
		if r == nil {
			continue
		}
		if !slices.Contains(ids, r.GetId()) {
			ids = append(ids, r.GetId())
		}
		if r.GetId() == marker {
			return ids
		}
	}
	require.NoError(t, stream.Err())
	t.Fatalf("the watch ended before %s", marker)
	return nil
}

// TestListAndWatchHonourProjectForbid: a policy forbidding one project hides
// its reservations from List and Watch as it does from Get; a watch open
// across the policy change follows it after the re-check, and ends with
// PERMISSION_DENIED when the watch itself is forbidden.
func TestListAndWatchHonourProjectForbid(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pr, err := f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "secret"}))
	require.NoError(t, err)
	secret := pr.Msg.GetProject().GetId()
	book := func(project string) string {
		return f.create(t, f.member, &apiv1.CreateReservationRequest{Project: project, Gpus: 1, DurationSeconds: 3600}).GetId()
	}

	// A watch that starts before the policy sees both projects.
	early, err := f.member.Reservations.Watch(ctx, connect.NewRequest(&apiv1.WatchReservationsRequest{Tenant: "acme", Cursor: "0"}))
	require.NoError(t, err)
	defer func() { _ = early.Close() }()
	hidden := book("secret")
	shown := book("default")
	require.Equal(t, []string{hidden, shown}, watched(t, early, shown))

	f.putPolicy(t, "hide-secret", fmt.Sprintf(`@id("hide-secret")
forbid (principal, action in BC::Action::"read", resource in BC::Project::%q);`, secret))

	_, err = f.member.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: hidden}))
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err), "get honoured the forbid before")
	list, err := f.member.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "acme"}))
	require.NoError(t, err)
	var ids []string
	for _, r := range list.Msg.GetReservations() {
		ids = append(ids, r.GetId())
	}
	require.Equal(t, []string{shown}, ids, "list omits the forbidden project's rows")
	_, err = f.member.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "acme", Project: "secret"}))
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err), "a list of the forbidden project is refused: %v", err)
	// A page thinned by the filter still leads to the rows after it.
	page, err := f.member.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "acme", PageSize: 1}))
	require.NoError(t, err)
	if len(page.Msg.GetReservations()) == 0 {
		require.NotEmpty(t, page.Msg.GetNextPageToken())
		page, err = f.member.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "acme", PageSize: 1, PageToken: page.Msg.GetNextPageToken()}))
		require.NoError(t, err)
	}
	require.Len(t, page.Msg.GetReservations(), 1)
	require.Equal(t, shown, page.Msg.GetReservations()[0].GetId())
	// The platform admin is not bound by the tenant's policies.
	all, err := f.admin.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, all.Msg.GetReservations(), 2)

	// A watch that starts after the policy never sends the project's events.
	late, err := f.member.Reservations.Watch(ctx, connect.NewRequest(&apiv1.WatchReservationsRequest{Tenant: "acme", Cursor: "0"}))
	require.NoError(t, err)
	defer func() { _ = late.Close() }()
	marker := book("default")
	require.Equal(t, []string{shown, marker}, watched(t, late, marker))

	// The early watch follows the policy once its re-check is due.
	f.cp.Clock.Advance(30 * time.Second)
	hidden2 := book("secret")
	marker2 := book("default")
	require.NotContains(t, watched(t, early, marker2), hidden2)

	// Forbidding the watch itself ends the stream at the next re-check.
	f.putPolicy(t, "no-watch", `@id("no-watch")
forbid (principal, action == BC::Action::"reservations.watch", resource);`)
	f.cp.Clock.Advance(30 * time.Second)
	for early.Receive() {
	}
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(early.Err()), "%v", early.Err())
}
