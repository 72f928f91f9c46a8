package podresources_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest/kubelet"
	"github.com/better-compute/better-compute/internal/kube/deviceplugin"
	"github.com/better-compute/better-compute/internal/kube/podresources"
	"github.com/better-compute/better-compute/internal/kubebind"
)

func TestSyncRecordsPodsAndCompletesWithdrawalsWhenTheyGo(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "pr")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	k, err := kubelet.Start(dir)
	require.NoError(t, err)
	t.Cleanup(k.Close)

	set := kubebind.New()
	require.NoError(t, set.Offer("res-a", []kubebind.Device{{UUID: "GPU-1", Healthy: true}, {UUID: "GPU-2", Healthy: true}}))
	p, err := podresources.New(podresources.Config{Set: set, Socket: k.PodResourcesSocket()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	select {
	case <-p.Synced():
		t.Fatal("synced before any sync")
	default:
	}

	// A container Allocate held for, not a listed pod yet.
	require.NoError(t, set.Hold(deviceplugin.HolderPrefix+"1", []string{"GPU-1"}))
	k.AddPod("train-0", []string{"GPU-2"})
	require.NoError(t, p.Sync(ctx))
	<-p.Synced()
	require.Equal(t, map[string][]string{"pod/default/train-0": {"GPU-2"}, deviceplugin.HolderPrefix + "1": {"GPU-1"}}, set.Holders(),
		"the allocating hold stays until its pod is listed")

	k.AddPod("train-1", []string{"GPU-1"})
	require.NoError(t, p.Sync(ctx))
	require.Equal(t, map[string][]string{"pod/default/train-0": {"GPU-2"}, "pod/default/train-1": {"GPU-1"}}, set.Holders())

	done := set.Withdraw("res-a")
	k.RemovePod("train-0")
	require.NoError(t, p.Sync(ctx))
	select {
	case <-done:
		t.Fatal("the withdrawal completed while train-1 holds GPU-1")
	default:
	}
	// The kubelet going away is no pod going away.
	k.Close()
	require.Error(t, p.Sync(ctx))
	require.Contains(t, set.Holders(), "pod/default/train-1")

	require.NoError(t, k.Restart())
	k.RemovePod("train-1")
	require.NoError(t, p.Sync(ctx))
	<-done
	require.Empty(t, set.Holders())
}
