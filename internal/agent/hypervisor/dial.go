package hypervisor

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/better-compute/better-compute/internal/netns"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// guestDialTimeout bounds reaching a guest's sshd for a tunnel.
const guestDialTimeout = 10 * time.Second

var _ vmcmd.GuestDialer = (*Hypervisor)(nil)

// DialGuest connects to a running guest's sshd (instance.tunnel): its
// address on the host network, from inside the network namespace that
// holds the bridge when there is one.
func (h *Hypervisor) DialGuest(ctx context.Context, id string) (net.Conn, error) {
	st, err := h.status(ctx, id)
	if err != nil {
		return nil, err
	}
	if st.State != vmcmd.StateRunning {
		return nil, failf(vmcmd.FailBusy, "instance %s is %s: its sshd does not answer", id, st.State)
	}
	if st.SSHAddress == "" {
		return nil, failf(vmcmd.FailRuntime, "instance %s has no address to reach its sshd", id)
	}
	ctx, cancel := context.WithTimeout(ctx, guestDialTimeout)
	defer cancel()
	var conn net.Conn
	switch {
	case h.dial != nil:
		conn, err = h.dial(ctx, st.SSHAddress)
	default:
		conn, err = netns.Dial(ctx, h.cfg.NetNS, "tcp", st.SSHAddress)
	}
	if err != nil {
		return nil, failf(vmcmd.FailRuntime, "instance %s: dial sshd at %s: %v", id, st.SSHAddress, err)
	}
	return conn, nil
}

// warmReadyDefault is how long a warm guest may take to boot to its sshd
// (a TCG guest on a busy host takes minutes).
const warmReadyDefault = 10 * time.Minute

// warmPoll is the pause between tries while a warm guest boots.
const warmPoll = 250 * time.Millisecond

// awaitBooted lets a guest that is to be kept warm boot until its sshd
// sends its banner, so a claim resumes a booted guest rather than one
// frozen at its first instruction. A guest that does not answer in time
// is paused all the same (logged): the claim then waits for the rest of
// its boot, as a cold create would.
func (h *Hypervisor) awaitBooted(ctx context.Context, id string) {
	limit := h.cfg.WarmReady
	if limit < 0 {
		return
	}
	if limit == 0 {
		limit = warmReadyDefault
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := time.Now()
	for {
		if sshBanner(ctx, h, id) {
			h.log.Info("hypervisor: warm guest booted", "instance", id, "after", time.Since(start).Round(time.Millisecond))
			return
		}
		t := time.NewTimer(warmPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			h.log.Warn("hypervisor: warm guest's sshd did not answer; pausing it unbooted", "instance", id, "waited", limit)
			return
		case <-t.C:
		}
	}
}

// sshBanner reports whether the guest's sshd answers with its banner.
func sshBanner(ctx context.Context, h *Hypervisor, id string) bool {
	conn, err := h.DialGuest(ctx, id)
	if err != nil {
		return false
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4)
	n, _ := io.ReadFull(conn, buf)
	return n == 4 && string(buf) == "SSH-"
}
