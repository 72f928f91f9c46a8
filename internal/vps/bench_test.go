package vps_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/sshexec"
	"github.com/better-compute/better-compute/internal/vps"
)

// BenchmarkInstanceCreate measures the control plane's part of an
// instance's life through the real API, gateway and agent protocol, with
// the fake hypervisor answering at once: from Create (decision, placement
// in the pool's placer, lease, command) to running (the host's answer
// converged), 8 creates in flight on 2 hosts. Then every instance is
// deleted, and no guest, lease or live booking may be left.
//
//	go test ./internal/vps -run '^$' -bench InstanceCreate -benchtime 200x
func BenchmarkInstanceCreate(b *testing.B) {
	h := setupHosts(b, 2)
	ctx := context.Background()
	_, err := h.acme.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Tenant: "acme", Name: "tiny", Vcpus: 1,
		MemoryMib: 1024, DiskGib: 1}))
	require.NoError(b, err)
	_, err = h.acme.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Tenant: "acme", Name: "big", Cidr: "10.64.0.0/16"}))
	require.NoError(b, err)
	const inFlight = 8
	lat := make([]time.Duration, b.N)
	ids := make([]string, b.N)
	next := make(chan int)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t0 := time.Now()
				res, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme",
					Name: fmt.Sprintf("vm-%d", i), Flavor: "tiny", Image: "debian-12", IpPool: "big"}))
				if err != nil {
					b.Error(err)
					return
				}
				ids[i] = res.Msg.GetInstance().GetId()
				waitState(b, h.acme, ids[i], vps.StateRunning)
				lat[i] = time.Since(t0)
			}
		}()
	}
	for i := range b.N {
		next <- i
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "instances/s")
	b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Milliseconds()), "p99-ms")

	for _, id := range ids {
		_, err := h.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: id}))
		require.NoError(b, err)
	}
	for _, id := range ids {
		waitState(b, h.acme, id, vps.StateDeleted)
	}
	for _, d := range h.sim.Daemons {
		require.Empty(b, d.Hypervisor().Guests(), "no guest left on a host")
	}
	require.Zero(b, h.count(b, `SELECT COUNT(*) FROM ip_leases`), "no lease left")
	require.Zero(b, h.count(b, `SELECT COUNT(*) FROM reservations WHERE state = 'active'`), "no live booking left")
}

// BenchmarkSSHExec measures exec into a guest on the fake hypervisor
// through the whole path, one at a time: Ssh (decision, certificate,
// ticket), GET /v1/ssh/tunnel (instance.tunnel command row, delivery to
// the host, the host's Tunnel stream over the real mTLS gateway), the SSH
// handshake with host pinning and `true` in the guest.
//
//	go test ./internal/vps -run '^$' -bench SSHExec -benchtime 100x
func BenchmarkSSHExec(b *testing.B) {
	h := setupHosts(b, 1)
	ctx := context.Background()
	h.runningInstance(b, "vm1")
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		tk, key := sshTicket(b, h, "vm1")
		res, err := sshexec.Run(ctx, sshexec.Params{APIURL: h.cp.URL, Ticket: tk, Key: key, Command: "true"})
		require.NoError(b, err)
		require.Zero(b, res.ExitCode)
		lat[i] = time.Since(t0)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
