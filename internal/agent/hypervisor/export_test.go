package hypervisor

import (
	"context"
	"net"
)

// SetDial replaces how the hypervisor reaches guests' sshd addresses.
func (h *Hypervisor) SetDial(d func(ctx context.Context, addr string) (net.Conn, error)) { h.dial = d }
