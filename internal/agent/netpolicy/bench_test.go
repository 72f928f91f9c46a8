package netpolicy

import (
	"context"
	"fmt"
	"os/exec"
	"testing"

	"github.com/better-compute/better-compute/internal/vmcmd"
)

// BenchmarkApply measures replacing one tap's policy on a host that
// already has 1, 10 or 100 other taps' (Apply reads the tap's state, then
// writes one batch):
// sudo go test -run XXX -bench Apply ./internal/agent/netpolicy
func BenchmarkApply(b *testing.B) {
	needNetns(b)
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("taps=%d", n), func(b *testing.B) { benchApply(b, n) })
	}
}

func benchApply(b *testing.B, benchTaps int) {
	ns := "bcnp-bench-" + randHex(3)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add: %v: %s", err, out)
	}
	b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	p := New(Config{NetNS: ns})
	ctx := context.Background()
	rule := func(i int, policy string) vmcmd.Rule {
		r := vmcmd.Rule{NetNS: ns, Bridge: "br0", Tap: fmt.Sprintf("bct%d", i), MAC: fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8, i&0xff),
			Address: fmt.Sprintf("10.77.%d.%d", i>>8, 10+i&0xff), Gateway: "10.77.255.1", Policy: policy}
		for j := range 8 {
			r.Peers = append(r.Peers, fmt.Sprintf("10.77.200.%d", j+1))
		}
		return r
	}
	for i := range benchTaps {
		if err := p.Apply(ctx, rule(i, vmcmd.PolicyPrivate)); err != nil {
			b.Fatal(err)
		}
	}
	policies := []string{vmcmd.PolicyEgress, vmcmd.PolicyPrivate, vmcmd.PolicyNone}
	i := 0
	for b.Loop() {
		if err := p.Apply(ctx, rule(benchTaps, policies[i%3])); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
