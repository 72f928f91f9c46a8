package reservation_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/iam"
)

// lifetimeCap refuses an extension whose decided lifetime is over a cap,
// as a Cedar policy on context.lifetimeSeconds would.
type lifetimeCap struct {
	iam.Authorizer
	max int64
}

func (c lifetimeCap) Authorize(ctx context.Context, req iam.Request) (iam.Decision, error) {
	if req.Action == "reservations.extend" {
		if l, _ := req.Context["lifetimeSeconds"].(int64); l > c.max {
			return iam.Decision{}, nil
		}
	}
	return c.Authorizer.Authorize(ctx, req)
}

// TestConcurrentExtendsKeepTheAuthorizedLifetime: eight extensions of +1 h
// race on a 1 h reservation under a 2 h lifetime cap. Each is decided on
// the row it read (1 h → 2 h, allowed); before the fix each then added its
// hour to whatever end it found, committing up to 9 h. Now each applies
// the absolute end it was authorized for and refuses with CONFLICT when the
// row moved, so the lifetime never passes the cap.
func TestConcurrentExtendsKeepTheAuthorizedLifetime(t *testing.T) {
	t.Parallel()
	e := setupTorture(t, 1, func(c *app.Config) {
		wrap := c.WrapAuthorizer
		c.WrapAuthorizer = func(inner iam.Authorizer) iam.Authorizer {
			return lifetimeCap{Authorizer: wrap(inner), max: int64((2 * time.Hour) / time.Second)}
		}
	})
	ctx := context.Background()
	res, err := e.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "acme", Project: "default", Pool: "main", Gpus: 1, DurationSeconds: 3600, Binding: reservation.BindingNone}))
	require.NoError(t, err)
	id := res.Msg.GetReservation().GetId()
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.admin.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{
				Tenant: "acme", Reservation: id, ExtendSeconds: 3600}))
			if err == nil {
				mu.Lock()
				ok++
				mu.Unlock()
				return
			}
			code := connect.CodeOf(err)
			require.Contains(t, []connect.Code{connect.CodeAborted, connect.CodePermissionDenied}, code, "%v", err)
		}()
	}
	wg.Wait()
	got, err := e.admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: id}))
	require.NoError(t, err)
	r := got.Msg.GetReservation()
	lifetime := r.GetEndTime().AsTime().Sub(r.GetStartTime().AsTime())
	require.LessOrEqual(t, lifetime, 2*time.Hour, "the committed lifetime passed the one authorized")
	require.Equal(t, 1, ok, "exactly one extension commits")
}
