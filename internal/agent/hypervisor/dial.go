package hypervisor

import (
	"context"
	"fmt"
	"net"
	"os"
	goruntime "runtime"
	"time"

	"golang.org/x/sys/unix"

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
	if h.cfg.NetNS == "" {
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", st.SSHAddress)
	} else {
		conn, err = dialInNetNS(ctx, h.cfg.NetNS, st.SSHAddress)
	}
	if err != nil {
		return nil, failf(vmcmd.FailRuntime, "instance %s: dial sshd at %s: %v", id, st.SSHAddress, err)
	}
	return conn, nil
}

// dialInNetNS makes the socket on a thread switched into the named
// namespace; the connection stays there after the thread switches back.
func dialInNetNS(ctx context.Context, ns, addr string) (net.Conn, error) {
	goruntime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		goruntime.UnlockOSThread()
		return nil, err
	}
	defer func() { _ = self.Close() }()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		goruntime.UnlockOSThread()
		return nil, err
	}
	defer func() { _ = target.Close() }()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		goruntime.UnlockOSThread()
		return nil, fmt.Errorf("enter network namespace %s: %w", ns, err)
	}
	conn, derr := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked and dies with the goroutine rather than
		// serve others from the wrong namespace.
		if conn != nil {
			_ = conn.Close()
		}
		return nil, fmt.Errorf("restore network namespace: %w", err)
	}
	goruntime.UnlockOSThread()
	return conn, derr
}
