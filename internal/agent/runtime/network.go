package runtime

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// ip runs iproute2's ip, in the spec's namespace when it names one.
func ip(ctx context.Context, netns string, args ...string) (string, error) {
	if netns != "" {
		args = append([]string{"-n", netns}, args...)
	}
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("runtime: ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

func linkExists(ctx context.Context, netns, name string) bool {
	_, err := ip(ctx, netns, "link", "show", "dev", name)
	return err == nil
}

// ensureTap creates the bridge (when missing) and the instance's tap on it.
func (r *Runtime) ensureTap(ctx context.Context, s *Spec) error {
	n := s.Network
	if err := r.ensureBridge(ctx, n); err != nil {
		return err
	}
	tap := s.tapName()
	if !linkExists(ctx, n.NetNS, tap) {
		if _, err := ip(ctx, n.NetNS, "tuntap", "add", "dev", tap, "mode", "tap"); err != nil {
			return err
		}
	}
	if _, err := ip(ctx, n.NetNS, "link", "set", tap, "master", n.Bridge, "up"); err != nil {
		return err
	}
	return nil
}

// ensureBridge creates the host's bridge when missing.
func (r *Runtime) ensureBridge(ctx context.Context, n *Network) error {
	r.bridgeMu.Lock()
	defer r.bridgeMu.Unlock()
	if linkExists(ctx, n.NetNS, n.Bridge) {
		return nil
	}
	if _, err := ip(ctx, n.NetNS, "link", "add", n.Bridge, "type", "bridge"); err != nil {
		return err
	}
	if n.BridgeAddress != "" {
		if _, err := ip(ctx, n.NetNS, "addr", "add", n.BridgeAddress, "dev", n.Bridge); err != nil {
			return err
		}
	}
	if _, err := ip(ctx, n.NetNS, "link", "set", n.Bridge, "up"); err != nil {
		return err
	}
	r.log.Info("runtime: bridge created", "bridge", n.Bridge, "netns", n.NetNS)
	return nil
}

func (r *Runtime) deleteTap(ctx context.Context, s *Spec) error {
	tap := s.tapName()
	if !linkExists(ctx, s.Network.NetNS, tap) {
		return nil
	}
	_, err := ip(ctx, s.Network.NetNS, "link", "del", tap)
	return err
}

// TapName is the tap device an instance's spec uses.
func TapName(s *Spec) string { return s.tapName() }
