package kubebind

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// A withdrawn allocation completes only once its last holder lets go, and
// its devices are not offered again meanwhile.
func TestWithdrawWaitsForHolders(t *testing.T) {
	s := New()
	ch := s.Changed()
	require.NoError(t, s.Offer("res_a", []Device{{UUID: "GPU-1", Healthy: true}, {UUID: "GPU-2", Healthy: true}}))
	require.True(t, closed(ch), "watchers hear of the offer")
	require.NoError(t, s.Hold("pod/p1", []string{"GPU-1"}))
	require.ErrorIs(t, s.Hold("pod/p2", []string{"GPU-9"}), ErrNotOffered)
	require.True(t, s.Held("res_a"))

	done := s.Withdraw("res_a")
	require.False(t, closed(done), "a pod still holds GPU-1")
	require.Empty(t, s.Devices())
	require.Error(t, s.Offer("res_b", []Device{{UUID: "GPU-1", Healthy: true}}), "GPU-1 is under a running pod")
	require.Error(t, s.Offer("res_b", []Device{{UUID: "GPU-2", Healthy: true}}), "the release is not complete: its booking stands")

	s.SetHolders("pod/", map[string][]string{})
	require.True(t, closed(done), "the last holder let go")
	require.False(t, s.Held("res_a"))
	require.NoError(t, s.Offer("res_b", []Device{{UUID: "GPU-1", Healthy: true}}), "released: free to offer again")
	require.True(t, closed(s.Withdraw("res_none")), "nothing offered: released at once")
}

func TestHealthAndRegistration(t *testing.T) {
	s := New()
	require.False(t, s.Registered())
	s.SetRegistered("deviceplugin", true)
	require.True(t, s.Registered())
	require.NoError(t, s.Offer("res_a", []Device{{UUID: "GPU-1", Healthy: true}}))
	ch := s.Changed()
	s.SetHealth("GPU-1", false)
	require.True(t, closed(ch), "a quarantine wakes the watchers")
	d, ok := s.Device("GPU-1")
	require.True(t, ok)
	require.False(t, d.Healthy)
	require.Error(t, s.Hold("claim/c1", []string{"GPU-1"}), "an unhealthy GPU is not handed out")
	require.Error(t, s.Offer("res_b", []Device{{UUID: "GPU-1", Healthy: true}}), "offered for another allocation")
}
