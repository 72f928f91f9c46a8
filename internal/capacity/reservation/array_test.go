package reservation_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/store"
)

// arrayWritten is what an array may write: reservations, bookings, events
// and audit rows of creates.
type arrayWritten struct {
	written
	audits int
}

func (f *fixture) arrayWritten(t *testing.T) arrayWritten {
	t.Helper()
	return arrayWritten{written: f.written(t), audits: f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'reservations.create'`)}
}

func (f *fixture) createArray(c *client.Client, tmpl *apiv1.CreateReservationRequest, count, minCount int32) (*apiv1.CreateReservationsResponse, error) {
	if tmpl != nil {
		tmpl.Tenant = cmpOr(tmpl.Tenant, "acme")
		tmpl.Pool = cmpOr(tmpl.Pool, "h100")
	}
	res, err := c.Reservations.CreateReservations(context.Background(), connect.NewRequest(&apiv1.CreateReservationsRequest{
		Template: tmpl, Count: count, MinCount: minCount}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestCreateArray: an array of 4 two-GPU reservations on a pool with room
// books 4 distinct reservations on distinct atoms, decided once, written
// with one audit row naming them all; a replay with the same idempotency
// key answers the same 4 and books nothing more.
func TestCreateArray(t *testing.T) {
	t.Parallel()
	f := setup(t, 2)
	ctx := context.Background()
	before := f.arrayWritten(t)
	f.cp.Authz.Reset()
	req := connect.NewRequest(&apiv1.CreateReservationsRequest{Count: 4, Template: &apiv1.CreateReservationRequest{
		Tenant: "acme", Pool: "h100", Gpus: 2, DurationSeconds: 3600, Binding: reservation.BindingNone}})
	req.Header().Set(client.HeaderIdempotencyKey, "array-1")
	res, err := f.member.Reservations.CreateReservations(ctx, req)
	require.NoError(t, err)
	require.Equal(t, 1, f.cp.Authz.Calls(), "one decision for the whole array")
	require.Equal(t, 1, f.cp.Authz.CallsFor("reservations.create"))
	rs := res.Msg.GetReservations()
	require.Len(t, rs, 4)
	require.Empty(t, res.Msg.GetShortfall())
	ids, atoms := map[string]bool{}, map[string]bool{}
	for _, r := range rs {
		require.NotEqual(t, "pending", r.GetState(), "an array is placed now")
		require.Equal(t, int32(2), r.GetSpec().GetGpus())
		require.Equal(t, "acme", r.GetTenant())
		ids[r.GetId()] = true
		for _, a := range r.GetPlacement().GetAtoms() {
			require.False(t, atoms[a], "atom %s booked twice", a)
			atoms[a] = true
		}
	}
	require.Len(t, ids, 4, "distinct reservations")
	require.Len(t, atoms, 8, "distinct atoms")
	after := f.arrayWritten(t)
	require.Equal(t, before.reservations+4, after.reservations)
	require.Equal(t, before.audits+1, after.audits, "one audit row for the one request")
	var detail string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT detail FROM audit_log WHERE action = 'reservations.create' AND resource_id = $1`, rs[0].GetId()).Scan(&detail)
	}))
	require.True(t, strings.HasPrefix(detail, "array of 4 (asked 4): "), detail)
	for id := range ids {
		require.Contains(t, detail, id)
	}
	require.Equal(t, 4, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'reservation.created' AND resource_id IN ($1, $2, $3, $4)`,
		rs[0].GetId(), rs[1].GetId(), rs[2].GetId(), rs[3].GetId()), "an event each")

	// The replay answers the same 4 and books nothing.
	again, err := f.member.Reservations.CreateReservations(ctx, req)
	require.NoError(t, err)
	require.Len(t, again.Msg.GetReservations(), 4)
	for i, r := range again.Msg.GetReservations() {
		require.Equal(t, rs[i].GetId(), r.GetId())
	}
	require.Equal(t, after.reservations, f.arrayWritten(t).reservations, "a replay books nothing")
}

// TestCreateArrayAllOrNothing: an array larger than what fits now is
// refused whole and writes nothing; with min_count it books what fits, at
// least min_count; an array never queues.
func TestCreateArrayAllOrNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, 1) // 8 GPUs
	tmpl := func() *apiv1.CreateReservationRequest {
		return &apiv1.CreateReservationRequest{Gpus: 3, DurationSeconds: 3600, Binding: reservation.BindingNone}
	}

	before := f.arrayWritten(t)
	_, err := f.createArray(f.member, tmpl(), 3, 0)
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "error: %v", err)
	require.Equal(t, "NO_CAPACITY", client.Code(err))
	require.Contains(t, err.Error(), "2 of the array's 3 fit now")
	require.Equal(t, before, f.arrayWritten(t), "a refused array writes nothing")
	_, pending := f.held(t)
	require.Zero(t, pending, "an array never queues")

	// min_count above what fits: refused, nothing written.
	_, err = f.createArray(f.member, tmpl(), 3, 3)
	require.Equal(t, "NO_CAPACITY", client.Code(err), "error: %v", err)
	require.Contains(t, err.Error(), "fewer than min_count 3")
	require.Equal(t, before, f.arrayWritten(t))

	// min_count within what fits: the ones placed now.
	res, err := f.createArray(f.member, tmpl(), 3, 1)
	require.NoError(t, err)
	require.Len(t, res.GetReservations(), 2)
	require.Contains(t, res.GetShortfall(), "2 of 3 booked")
	held, pending := f.held(t)
	require.Equal(t, 2, held)
	require.Zero(t, pending)

	// Nothing fits now at all, even with min_count 1: refused.
	_, err = f.createArray(f.member, tmpl(), 2, 1)
	require.Equal(t, "NO_CAPACITY", client.Code(err), "error: %v", err)

	// A member that could never fit is refused as Create refuses it.
	_, err = f.createArray(f.member, &apiv1.CreateReservationRequest{Gpus: 9}, 2, 0)
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "error: %v", err)
	require.Contains(t, err.Error(), "can never hold this request")
}

// TestCreateArrayQuota: the array's charges are checked together, so an
// array a quota cannot hold as a whole is refused whole (or cut to what
// fits when min_count allows). Item by item (the fallback after a failed
// batch, which writes as it goes) the member refused by the quota after it
// booked leaves no booking behind: the torture test once found one.
func TestCreateArrayQuota(t *testing.T) {
	t.Parallel()
	for _, itemByItem := range []bool{false, true} {
		t.Run(map[bool]string{false: "staged", true: "item by item"}[itemByItem], func(t *testing.T) {
			t.Parallel()
			f := setup(t, 2)
			f.cp.App.Capacity.Engine.SetItemByItem(itemByItem)
			ctx := context.Background()
			gpus := int32(5)
			_, err := f.admin.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "acme", Gpus: &gpus}))
			require.NoError(t, err)
			tmpl := func() *apiv1.CreateReservationRequest {
				return &apiv1.CreateReservationRequest{Gpus: 2, DurationSeconds: 3600, Binding: reservation.BindingNone}
			}
			before := f.arrayWritten(t)
			// Each member alone is within the quota; the three together are not.
			_, err = f.createArray(f.member, tmpl(), 3, 0)
			require.Equal(t, "QUOTA_EXCEEDED", client.Code(err), "error: %v", err)
			require.Equal(t, before, f.arrayWritten(t), "a refused array writes nothing")

			res, err := f.createArray(f.member, tmpl(), 3, 2)
			require.NoError(t, err)
			require.Len(t, res.GetReservations(), 2, "cut to what the quota holds")
			require.Contains(t, res.GetShortfall(), "2 of 3 booked")
			require.Zero(t, f.count(t, `SELECT COUNT(*) FROM bookings b WHERE NOT EXISTS
				(SELECT 1 FROM reservations r WHERE r.id = b.reservation_id)`), "no booking outlives its member")
			require.Equal(t, 4, f.count(t, `SELECT COUNT(*) FROM bookings`), "two members of 2 GPUs")
		})
	}
}

// TestCreateArrayRefusesBadInput: field errors name the array's fields and
// the template's under template., and nothing is written or decided.
func TestCreateArrayRefusesBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ok := func() *apiv1.CreateReservationRequest { return &apiv1.CreateReservationRequest{Gpus: 1} }
	cases := []struct {
		name            string
		tmpl            *apiv1.CreateReservationRequest
		count, minCount int32
		field           string
	}{
		{"no count", ok(), 0, 0, "count"},
		{"negative count", ok(), -1, 0, "count"},
		{"too many", ok(), reservation.MaxArray + 1, 0, "count"},
		{"negative min", ok(), 2, -1, "min_count"},
		{"min above count", ok(), 2, 3, "min_count"},
		{"no template", nil, 2, 0, "template"},
		{"template without gpus", &apiv1.CreateReservationRequest{}, 2, 0, "template.gpus"},
		{"template with a bad binding", &apiv1.CreateReservationRequest{Gpus: 1, Binding: "pod"}, 2, 0, "template.binding"},
		// Checked against the pool, after the decision.
		{"template longer than the pool books", &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: poolMaxDuration + 3600}, 2, 0,
			"template.duration_seconds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := f.arrayWritten(t)
			_, err := f.createArray(f.member, tc.tmpl, tc.count, tc.minCount)
			requireViolation(t, err, tc.field)
			require.Equal(t, before, f.arrayWritten(t), "a refused request books nothing")
		})
	}
}

// TestCreateArrayOtherTenant: another tenant cannot book an array in a pool
// not offered to it; it gets Create's answer and nothing is written.
func TestCreateArrayOtherTenant(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	before := f.written(t)
	tmpl := &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 1}
	_, createErr := f.evil.Reservations.Create(context.Background(), connect.NewRequest(tmpl))
	_, err := f.createArray(f.evil, &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 1}, 2, 0)
	require.Error(t, err)
	require.Equal(t, client.Code(createErr), client.Code(err), "the same refusal as Create: %v", err)
	// In its own tenant, acme's pool is not offered to it.
	_, createErr = f.evil.Reservations.Create(context.Background(), connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "other", Pool: "h100", Gpus: 1}))
	_, err = f.createArray(f.evil, &apiv1.CreateReservationRequest{Tenant: "other", Pool: "h100", Gpus: 1}, 2, 0)
	require.Equal(t, "NOT_FOUND", client.Code(err), "error: %v", err)
	require.Equal(t, client.Code(createErr), client.Code(err))
	require.Equal(t, before, f.written(t), "nothing booked")
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM reservations WHERE tenant_id <> $1`, f.acme))
}

// TestCreateArrayPolicyBoundsTotal: a tenant policy bounds an array's
// total GPUs (resource.totalGpus) and its count (context.count).
func TestCreateArrayPolicyBoundsTotal(t *testing.T) {
	t.Parallel()
	f := setup(t, 2)
	ctx := context.Background()
	_, err := f.admin.Policies.Put(ctx, connect.NewRequest(&apiv1.PutPolicyRequest{Tenant: "acme", Id: "bound-arrays",
		Text: `@id("bound-arrays") forbid (principal, action == BC::Action::"reservations.create", resource)
when { (resource has totalGpus && resource.totalGpus > 8) || (context has count && context.count > 3) };`}))
	require.NoError(t, err)
	before := f.written(t)
	tmpl := func() *apiv1.CreateReservationRequest {
		return &apiv1.CreateReservationRequest{Gpus: 3, DurationSeconds: 3600, Binding: reservation.BindingNone}
	}
	_, err = f.createArray(f.member, tmpl(), 3, 0) // 9 GPUs
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "error: %v", err)
	_, err = f.createArray(f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600, Binding: reservation.BindingNone}, 4, 0)
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "error: %v", err)
	require.Equal(t, before, f.written(t))
	res, err := f.createArray(f.member, &apiv1.CreateReservationRequest{Gpus: 2, DurationSeconds: 3600, Binding: reservation.BindingNone}, 3, 0)
	require.NoError(t, err)
	require.Len(t, res.GetReservations(), 3)
}
