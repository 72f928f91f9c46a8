package deviceplugin_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/better-compute/better-compute/bctest/kubelet"
	"github.com/better-compute/better-compute/internal/kube/deviceplugin"
	"github.com/better-compute/better-compute/internal/kube/podresources"
	"github.com/better-compute/better-compute/internal/kubebind"
)

// shortDir is a temp dir short enough for unix socket paths (108 bytes).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "dp")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func gpu(uuid, island string) kubebind.Device {
	return kubebind.Device{UUID: uuid, Paths: []string{"/dev/nvidia-" + uuid, "/dev/nvidiactl"}, Model: "H100", MemoryMiB: 81559,
		NVLinkIsland: island, Healthy: true}
}

type rig struct {
	set    *kubebind.Set
	k      *kubelet.Kubelet
	plugin *deviceplugin.Plugin
	ctx    context.Context
}

func start(t *testing.T) *rig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	k, err := kubelet.Start(shortDir(t))
	require.NoError(t, err)
	t.Cleanup(k.Close)
	set := kubebind.New()
	p, err := deviceplugin.New(deviceplugin.Config{Set: set, Dir: k.DevicePluginDir(), WatchInterval: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
		require.False(t, set.Registered(), "a plugin that stopped is not registered")
	})
	return &rig{set: set, k: k, plugin: p, ctx: ctx}
}

// waitRegistered waits for the plugin's own view of its registration.
func (r *rig) waitRegistered(t *testing.T) {
	t.Helper()
	for {
		ok, ch := r.plugin.Registered()
		if ok {
			require.True(t, r.set.Registered())
			return
		}
		select {
		case <-r.ctx.Done():
			t.Fatal("the plugin never registered")
		case <-ch:
		}
	}
}

func TestRegisterListAllocateAndRegisterAgainAfterKubeletRestart(t *testing.T) {
	t.Parallel()
	r := start(t)
	require.NoError(t, r.set.Offer("res-a", []kubebind.Device{gpu("GPU-1", "i0"), gpu("GPU-2", "i0")}))

	st, err := r.k.Wait(r.ctx, func(s kubelet.State) bool { return len(s.Healthy()) == 2 })
	require.NoError(t, err)
	r.waitRegistered(t)
	require.Len(t, st.Registrations, 1)
	reg := st.Registrations[0]
	require.Equal(t, v1beta1.Version, reg.Version)
	require.Equal(t, deviceplugin.ResourceName, reg.ResourceName)
	require.Equal(t, deviceplugin.DefaultSocket, reg.Endpoint)
	require.True(t, reg.Options.GetGetPreferredAllocationAvailable())
	st, err = r.k.Wait(r.ctx, func(s kubelet.State) bool { return s.Options != nil })
	require.NoError(t, err)
	require.True(t, st.Options.GetGetPreferredAllocationAvailable())
	require.False(t, st.Options.GetPreStartRequired())

	resp, err := r.k.Allocate(r.ctx, "GPU-2", "GPU-1")
	require.NoError(t, err)
	require.Equal(t, "GPU-2,GPU-1", resp.GetEnvs()["NVIDIA_VISIBLE_DEVICES"])
	require.Equal(t, "GPU-2,GPU-1", resp.GetEnvs()["CUDA_VISIBLE_DEVICES"])
	require.Equal(t, "res-a", resp.GetAnnotations()[deviceplugin.AnnotationReservation])
	var paths []string
	for _, d := range resp.GetDevices() {
		require.Equal(t, d.GetHostPath(), d.GetContainerPath())
		require.Equal(t, "rw", d.GetPermissions())
		paths = append(paths, d.GetHostPath())
	}
	require.Equal(t, []string{"/dev/nvidia-GPU-2", "/dev/nvidiactl", "/dev/nvidia-GPU-1"}, paths, "each node once")
	require.Contains(t, r.set.Holders(), deviceplugin.HolderPrefix+"1", "Allocate holds the GPUs until the pod is listed")

	// A kubelet that restarts forgets its plugins and removes their
	// sockets: bcd serves and registers again. Twice, when bcd's tick
	// fell between the kubelet's stop and start: the starting kubelet
	// removed the socket bcd had just made, and bcd makes it again. The
	// kubelet forgets the devices at each registration, so two healthy
	// ones are the latest registration's list.
	require.NoError(t, r.k.Restart())
	st, err = r.k.Wait(r.ctx, func(s kubelet.State) bool { return len(s.Registrations) >= 2 && len(s.Healthy()) == 2 })
	require.NoError(t, err)
	require.Equal(t, []string{"GPU-1", "GPU-2"}, st.Healthy())
	r.waitRegistered(t)
	_, err = r.k.Allocate(r.ctx, "GPU-1")
	require.NoError(t, err, "the new registration serves Allocate")
}

func TestQuarantinedGPULeavesTheHealthySetInOneUpdate(t *testing.T) {
	t.Parallel()
	r := start(t)
	require.NoError(t, r.set.Offer("res-a", []kubebind.Device{gpu("GPU-1", "i0"), gpu("GPU-2", "i0")}))
	st, err := r.k.Wait(r.ctx, func(s kubelet.State) bool { return len(s.Healthy()) == 2 })
	require.NoError(t, err)
	before := st.Lists

	r.set.SetHealth("GPU-2", false)
	st, err = r.k.Wait(r.ctx, func(s kubelet.State) bool { return s.Lists > before })
	require.NoError(t, err)
	require.Equal(t, before+1, st.Lists)
	require.Equal(t, []string{"GPU-1"}, st.Healthy(), "the next list already has it unhealthy")
	require.Equal(t, v1beta1.Unhealthy, st.Devices["GPU-2"])

	_, err = r.k.Allocate(r.ctx, "GPU-2")
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "unhealthy")
	require.Empty(t, r.set.Holders(), "a refused Allocate holds nothing")
}

func TestAllocateRefusesWhatIsNotOfferedAndMixedReservations(t *testing.T) {
	t.Parallel()
	r := start(t)
	require.NoError(t, r.set.Offer("res-a", []kubebind.Device{gpu("GPU-1", "i0")}))
	require.NoError(t, r.set.Offer("res-b", []kubebind.Device{gpu("GPU-3", "i1")}))
	_, err := r.k.Wait(r.ctx, func(s kubelet.State) bool { return len(s.Healthy()) == 2 })
	require.NoError(t, err)

	_, err = r.k.Allocate(r.ctx, "GPU-9")
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "GPU-9 is not offered")

	_, err = r.k.Allocate(r.ctx, "GPU-1", "GPU-3")
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "reservations res-a and res-b")

	// Prepared for a DRA claim: that claim's pod's, refused here.
	require.NoError(t, r.set.Hold("claim/c1", []string{"GPU-3"}))
	_, err = r.k.Allocate(r.ctx, "GPU-3")
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "held by DRA claim/c1")
	r.set.Let("claim/c1")

	// Withdrawn: gone from the list, refused.
	require.NotNil(t, r.set.Withdraw("res-b"))
	_, err = r.k.Wait(r.ctx, func(s kubelet.State) bool { return len(s.Devices) == 1 })
	require.NoError(t, err)
	_, err = r.k.Allocate(r.ctx, "GPU-3")
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.Empty(t, r.set.Holders())
}

func TestPreferredAllocationKeepsToOneReservationAndIsland(t *testing.T) {
	t.Parallel()
	r := start(t)
	require.NoError(t, r.set.Offer("big", []kubebind.Device{gpu("A1", "i0"), gpu("A2", "i1"), gpu("A3", "i1"), gpu("A4", "i1")}))
	require.NoError(t, r.set.Offer("small", []kubebind.Device{gpu("B1", "i2"), gpu("B2", "i2")}))
	_, err := r.k.Wait(r.ctx, func(s kubelet.State) bool { return len(s.Healthy()) == 6 })
	require.NoError(t, err)
	all := []string{"A1", "A2", "A3", "A4", "B1", "B2"}

	got, err := r.k.GetPreferredAllocation(r.ctx, all, nil, 2)
	require.NoError(t, err)
	require.Equal(t, []string{"B1", "B2"}, got, "the smallest reservation that fits, whole")

	got, err = r.k.GetPreferredAllocation(r.ctx, all, nil, 3)
	require.NoError(t, err)
	require.Equal(t, []string{"A2", "A3", "A4"}, got, "the reservation that fits, on its largest island")

	got, err = r.k.GetPreferredAllocation(r.ctx, all, []string{"A1"}, 2)
	require.NoError(t, err)
	require.Equal(t, "A1", got[0])
	require.Len(t, got, 2)
	require.True(t, slices.Contains([]string{"A2", "A3", "A4"}, got[1]), "the reservation of the device it must include: %v", got)
}

// TestReleaseWaitsForThePodTheKubeletStarted follows one GPU from
// Allocate to the pod's end: the hold Allocate makes turns into the pod's
// once PodResources lists it, and a withdrawal completes only when the
// pod is gone.
func TestReleaseWaitsForThePodTheKubeletStarted(t *testing.T) {
	t.Parallel()
	r := start(t)
	poller, err := podresources.New(podresources.Config{Set: r.set, Socket: r.k.PodResourcesSocket()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = poller.Close() })
	require.NoError(t, r.set.Offer("res-a", []kubebind.Device{gpu("GPU-1", "i0")}))
	_, err = r.k.Wait(r.ctx, func(s kubelet.State) bool { return len(s.Healthy()) == 1 })
	require.NoError(t, err)

	_, err = r.k.Allocate(r.ctx, "GPU-1")
	require.NoError(t, err)
	// Released before the pod is listed: the Allocate hold keeps it.
	done := r.set.Withdraw("res-a")
	require.NoError(t, poller.Sync(r.ctx))
	select {
	case <-done:
		t.Fatal("released between Allocate and the pod's listing")
	default:
	}
	r.k.AddPod("train", []string{"GPU-1"})
	require.NoError(t, poller.Sync(r.ctx))
	require.Equal(t, map[string][]string{"pod/default/train": {"GPU-1"}}, r.set.Holders(), "the pod holds it now, not Allocate")
	select {
	case <-done:
		t.Fatal("released while the pod runs")
	default:
	}
	r.k.RemovePod("train")
	require.NoError(t, poller.Sync(r.ctx))
	<-done
}
