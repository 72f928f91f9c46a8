package app_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// ltDenyRows counts the deny rows of one principal by result.
func ltDenyRows(t *testing.T, cp *bctest.ControlPlane, principalID string) map[string]int {
	t.Helper()
	out := map[string]int{}
	err := cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT result, count(*) FROM audit_log WHERE principal_id = $1 AND decision = 'deny' GROUP BY result`, principalID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				r string
				n int
			)
			if err := rows.Scan(&r, &n); err != nil {
				return err
			}
			out[r] = n
		}
		return rows.Err()
	})
	require.NoError(t, err)
	return out
}

// TestRefusalAuditIsBounded: refusals are written into the targeted
// tenant's audit log, so one key could once fill a victim's log without
// bound. Each principal now writes at most the limit per window, plus one
// row saying the rest went unrecorded, while every call is still refused
// and another principal's refusals are still recorded.
func TestRefusalAuditIsBounded(t *testing.T) {
	t.Parallel()
	const limit = 3
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.RefusalAuditLimit, c.RefusalAuditWindow = limit, time.Minute
	})
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "victim")
	sfTenant(t, admin, "evil")
	floodSecret, flood := sfKey(t, admin, "evil", "admin", 0)
	otherSecret, other := sfKey(t, admin, "evil", "member", 0)
	attempt := func(secret string) {
		t.Helper()
		_, err := cp.Client(secret).Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "victim", Name: "x"}))
		sfRequireCode(t, err, "PERMISSION_DENIED")
	}

	for range 20 {
		attempt(floodSecret)
	}
	require.Equal(t, map[string]int{"PERMISSION_DENIED": limit, envelope.ResultAuditLimited: 1}, ltDenyRows(t, cp, flood.GetId()))

	for range 2 {
		attempt(otherSecret)
	}
	require.Equal(t, map[string]int{"PERMISSION_DENIED": 2}, ltDenyRows(t, cp, other.GetId()), "another principal is recorded")

	// A new window records again.
	cp.Clock.Advance(time.Minute)
	attempt(floodSecret)
	require.Equal(t, map[string]int{"PERMISSION_DENIED": limit + 1, envelope.ResultAuditLimited: 1}, ltDenyRows(t, cp, flood.GetId()))
}
