package netpolicy

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/vmcmd"
)

func goodRule() vmcmd.Rule {
	return vmcmd.Rule{Bridge: "bcbr0", Tap: "bct-1", MAC: "02:00:00:00:00:11", Address: "10.77.0.11",
		Gateway: "10.77.0.1", Policy: vmcmd.PolicyPrivate, Peers: []string{"10.77.0.12"}}
}

func TestCheckRefusesBadRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		edit  func(*vmcmd.Rule)
		field string
	}{
		{"netns with a slash", func(r *vmcmd.Rule) { r.NetNS = "../x" }, "netns"},
		{"no bridge", func(r *vmcmd.Rule) { r.Bridge = "" }, "bridge"},
		{"tap too long", func(r *vmcmd.Rule) { r.Tap = "tap0123456789abc" }, "tap"},
		{"tap with a space", func(r *vmcmd.Rule) { r.Tap = "tap 1" }, "tap"},
		{"tap is the bridge", func(r *vmcmd.Rule) { r.Tap = r.Bridge }, "tap"},
		{"bad MAC", func(r *vmcmd.Rule) { r.MAC = "02:00:00:00:00" }, "mac"},
		{"multicast MAC", func(r *vmcmd.Rule) { r.MAC = "01:00:5e:00:00:01" }, "mac"},
		{"EUI-64 MAC", func(r *vmcmd.Rule) { r.MAC = "02:00:00:00:00:00:00:01" }, "mac"},
		{"address with prefix", func(r *vmcmd.Rule) { r.Address = "10.77.0.11/24" }, "address"},
		{"IPv6 address", func(r *vmcmd.Rule) { r.Address = "fd00::11" }, "address"},
		{"broadcast address", func(r *vmcmd.Rule) { r.Address = "255.255.255.255" }, "address"},
		{"no gateway", func(r *vmcmd.Rule) { r.Gateway = "" }, "gateway"},
		{"gateway is the guest", func(r *vmcmd.Rule) { r.Gateway = r.Address }, "gateway"},
		{"unknown policy", func(r *vmcmd.Rule) { r.Policy = "public" }, "policy"},
		{"peer not an address", func(r *vmcmd.Rule) { r.Peers = []string{"10.77.0.12", "a2"} }, "peers[1]"},
		{"peer with prefix", func(r *vmcmd.Rule) { r.Peers = []string{"10.77.0.0/24"} }, "peers[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := goodRule()
			tc.edit(&r)
			_, err := check(r)
			var re *RuleError
			require.True(t, errors.As(err, &re), "%v", err)
			require.Equal(t, tc.field, re.Field)
			require.ErrorContains(t, err, "netpolicy: invalid rule: "+tc.field+": ")
		})
	}
}

func TestCheckNormalises(t *testing.T) {
	t.Parallel()
	r := goodRule()
	r.Policy = ""
	r.Peers = []string{"10.77.0.12", "10.77.0.11", "10.77.0.1", "10.77.0.12", "10.77.0.13"}
	got, err := check(r)
	require.NoError(t, err)
	require.Equal(t, vmcmd.PolicyEgress, got.policy, "egress is the default")
	require.Len(t, got.peers, 2, "the guest itself, the gateway and duplicates are dropped")
}

// Remove's tap is validated like Apply's, before any kernel access.
func TestRemoveRefusesBadTap(t *testing.T) {
	t.Parallel()
	err := New(Config{NetNSDir: t.TempDir()}).Remove(context.Background(), "a/b")
	var re *RuleError
	require.True(t, errors.As(err, &re), "%v", err)
	require.Equal(t, "tap", re.Field)
}

// A namespace that cannot be opened makes Supported false, with the reason.
func TestSupportedNeedsItsNamespace(t *testing.T) {
	t.Parallel()
	p := New(Config{NetNS: "missing", NetNSDir: t.TempDir()})
	require.False(t, p.Supported(context.Background()))
	require.ErrorContains(t, p.Reason(context.Background()), `network namespace "missing"`)
}
