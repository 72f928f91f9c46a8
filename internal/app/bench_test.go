package app_test

import (
	"context"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// BenchmarkProjectCreate measures one whole mutation through the envelope
// over loopback HTTP: authenticate, validate, draft, one Cedar decision, one
// transaction with its audit row and outbox event.
func BenchmarkProjectCreate(b *testing.B) {
	cp := bctest.NewControlPlane(b)
	ctx := context.Background()
	admin := cp.Admin()
	if _, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "bench"})); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "bench", Name: fmt.Sprintf("p-%d", i)})); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProjectGet measures a read: authenticate (cached), resolve, a
// cached read decision, one query.
func BenchmarkProjectGet(b *testing.B) {
	cp := bctest.NewControlPlane(b)
	ctx := context.Background()
	admin := cp.Admin()
	if _, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "bench"})); err != nil {
		b.Fatal(err)
	}
	if _, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "bench", Name: "web"})); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := admin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "bench", Project: "web"})); err != nil {
			b.Fatal(err)
		}
	}
}
