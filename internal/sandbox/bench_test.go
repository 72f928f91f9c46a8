package sandbox_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// BenchmarkSandboxCreate measures one sandbox create through the real API
// until the sandbox is running, on one simulated host with the fake
// hypervisor (no guest boots: this is the control plane's share): warm
// claims a paused instance and resumes it; cold books, leases and boots
// one. Each op deletes its sandbox untimed; the warm pool is refilled
// untimed.
func BenchmarkSandboxCreate(b *testing.B) {
	for _, mode := range []string{"warm", "cold"} {
		b.Run(mode, func(b *testing.B) {
			f := setup(b, 1)
			ctx := context.Background()
			warm := int32(0)
			if mode == "warm" {
				warm = 1
			}
			res, err := f.acme.SandboxTemplates.Create(ctx, connect.NewRequest(templateReq("t1", warm, warm)))
			require.NoError(b, err)
			tpl := res.Msg.GetTemplate()
			var total time.Duration
			b.ResetTimer()
			b.StopTimer()
			for range b.N {
				if mode == "warm" {
					require.NoError(b, f.cp.App.Sandboxes.ReconcileWarm(ctx))
					f.warmReady(b, tpl.GetId(), 1)
				}
				start := time.Now()
				b.StartTimer()
				c, err := f.acme.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: "t1"}))
				require.NoError(b, err)
				id := c.Msg.GetSandbox().GetId()
				require.Equal(b, mode, c.Msg.GetSandbox().GetOrigin())
				for f.sandbox(b, id).GetState() != "running" {
					time.Sleep(200 * time.Microsecond)
				}
				b.StopTimer()
				total += time.Since(start)
				_, err = f.acme.Sandboxes.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "acme", Sandbox: id}))
				require.NoError(b, err)
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "ms/running")
		})
	}
}
