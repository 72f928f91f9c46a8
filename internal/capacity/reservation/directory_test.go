package reservation_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/authn"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/store/dirversion"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// directoryCaches are the caches a create reads its caller, tenant, project
// and pool from.
var directoryCaches = []string{authn.KeyCacheName, tenancy.TenantCacheName, tenancy.ProjectCacheName,
	reservation.DefaultProjectCacheName, pool.VisibleCacheName}

func (f *offerFixture) create(tenant string, req *apiv1.CreateReservationRequest) (*apiv1.Reservation, error) {
	req.Tenant, req.Gpus, req.Binding = tenant, 1, reservation.BindingNone
	if req.Pool == "" {
		req.Pool = "gpus"
	}
	if req.DurationSeconds == 0 {
		req.DurationSeconds = 3600
	}
	res, err := f.members[tenant].Reservations.Create(context.Background(), connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetReservation(), nil
}

// TestCreateSeesDirectoryChangesAtOnce: a create reads its key, tenant,
// project and pool from the directory caches — a second create reads none
// of them — and yet sees a change made by another replica on the very next
// request: a pool's policy, an offer withdrawn, a project deleted (named,
// or the default one). Each
// change moves the directory version on in its own transaction; without
// that, each refusal below would be a stale success.
func TestCreateSeesDirectoryChangesAtOnce(t *testing.T) {
	t.Parallel()
	f := setupOffers(t)
	ctx := context.Background()
	_, err := f.owner.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "operator", Pool: "gpus", To: []string{"acme", "globex"}}))
	require.NoError(t, err)
	_, err = f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "globex", Name: "scratch"}))
	require.NoError(t, err)

	stats := func() map[string]dirversion.Stats {
		out := map[string]dirversion.Stats{}
		for _, name := range directoryCaches {
			out[name] = f.cp.App.Envelope.Directory().Stats(name)
		}
		return out
	}
	_, err = f.create("acme", &apiv1.CreateReservationRequest{})
	require.NoError(t, err)
	_, err = f.create("acme", &apiv1.CreateReservationRequest{Project: "default"})
	require.NoError(t, err)
	_, err = f.create("globex", &apiv1.CreateReservationRequest{Project: "scratch"})
	require.NoError(t, err)
	_, err = f.create("globex", &apiv1.CreateReservationRequest{})
	require.NoError(t, err)
	before := stats()
	_, err = f.create("acme", &apiv1.CreateReservationRequest{})
	require.NoError(t, err)
	_, err = f.create("acme", &apiv1.CreateReservationRequest{Project: "default"})
	require.NoError(t, err)
	_, err = f.create("globex", &apiv1.CreateReservationRequest{Project: "scratch"})
	require.NoError(t, err)
	_, err = f.create("globex", &apiv1.CreateReservationRequest{})
	require.NoError(t, err)
	for name, got := range stats() {
		require.Equal(t, before[name].Misses, got.Misses, "%s: a warm create reads nothing of the directory", name)
		require.Greater(t, got.Hits, before[name].Hits, "%s: a warm create is answered from the cache", name)
	}

	// The changes come from another replica on the same database (after
	// the pool's placer is this one's).
	other := f.cp.NewReplica(t).Admin()

	// A policy change: the next preview and create on this replica
	// follow it.
	_, err = other.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "operator", Pool: "gpus",
		Policy: &apiv1.PoolPolicy{MaxDurationSeconds: 1800}}))
	require.NoError(t, err)
	_, err = f.members["acme"].Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{
		Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "gpus", Gpus: 1, DurationSeconds: 3600, Binding: reservation.BindingNone}}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%v", err)
	require.Contains(t, err.Error(), "books at most")
	_, err = f.create("acme", &apiv1.CreateReservationRequest{})
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%v", err)

	// An offer withdrawn from acme: its next create does not find the pool.
	_, err = other.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "operator", Pool: "gpus", To: []string{"globex"}}))
	require.NoError(t, err)
	_, err = f.create("acme", &apiv1.CreateReservationRequest{DurationSeconds: 1800})
	require.Equal(t, "NOT_FOUND", client.Code(err), "%v", err)
	require.Contains(t, err.Error(), "pool")

	// A project deleted: the next create naming it does not find it.
	_, err = other.Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "globex", Project: "scratch"}))
	require.NoError(t, err)
	_, err = f.create("globex", &apiv1.CreateReservationRequest{Project: "scratch", DurationSeconds: 1800})
	require.Equal(t, "NOT_FOUND", client.Code(err), "%v", err)
	require.Contains(t, err.Error(), "project")

	// Its last project deleted, globex's create that names none has no
	// default project to book into.
	_, err = other.Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "globex", Project: "default"}))
	require.NoError(t, err)
	_, err = f.create("globex", &apiv1.CreateReservationRequest{DurationSeconds: 1800})
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%v", err)
	require.Contains(t, err.Error(), "project")
}

// TestDirectoryCacheKeepsTenantsApart: what one tenant resolved is never
// another's answer. With acme's project ml and the pool offered to acme
// cached, a stranger naming them (by name, by id, as owner/name) finds
// neither, and each tenant's create that names no project books into its
// own default project.
func TestDirectoryCacheKeepsTenantsApart(t *testing.T) {
	t.Parallel()
	f := setupOffers(t)
	ctx := context.Background()
	_, err := f.owner.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "operator", Pool: "gpus", To: []string{"acme", "globex"}}))
	require.NoError(t, err)
	ml, err := f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "ml"}))
	require.NoError(t, err)
	mlID := ml.Msg.GetProject().GetId()
	for range 2 { // the second from the cache
		r, err := f.create("acme", &apiv1.CreateReservationRequest{Project: "ml"})
		require.NoError(t, err)
		require.Equal(t, mlID, r.GetProjectId())
		_, err = f.create("acme", &apiv1.CreateReservationRequest{Project: mlID, Pool: f.poolID})
		require.NoError(t, err)
		_, err = f.create("acme", &apiv1.CreateReservationRequest{Pool: "operator/gpus"})
		require.NoError(t, err)
	}
	require.NotZero(t, f.cp.App.Envelope.Directory().Stats(pool.VisibleCacheName).Hits)
	require.NotZero(t, f.cp.App.Envelope.Directory().Stats(tenancy.ProjectCacheName).Hits)

	for _, pl := range []string{"gpus", f.poolID, "operator/gpus"} {
		_, err := f.create("stranger", &apiv1.CreateReservationRequest{Pool: pl})
		require.Equal(t, "NOT_FOUND", client.Code(err), "pool %s: %v", pl, err)
		require.Contains(t, err.Error(), "pool", "pool %s", pl)
	}
	for _, prj := range []string{"ml", mlID} {
		_, err := f.create("globex", &apiv1.CreateReservationRequest{Project: prj})
		require.Equal(t, "NOT_FOUND", client.Code(err), "project %s: %v", prj, err)
		require.Contains(t, err.Error(), "project", "project %s", prj)
	}

	// Each tenant's default project is its own, cached or not.
	for range 2 {
		for _, tenant := range []string{"acme", "globex"} {
			want, err := f.admin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: tenant, Project: "default"}))
			require.NoError(t, err)
			r, err := f.create(tenant, &apiv1.CreateReservationRequest{})
			require.NoError(t, err)
			require.Equal(t, want.Msg.GetProject().GetId(), r.GetProjectId(), tenant)
		}
	}
	require.NotZero(t, f.cp.App.Envelope.Directory().Stats(reservation.DefaultProjectCacheName).Hits)
}
