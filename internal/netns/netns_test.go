package netns_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/netns"
)

func TestRefusesBadNames(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"../etc", "a/b", "."} {
		err := netns.Do(name, func() error { return nil })
		require.ErrorContains(t, err, "not a namespace name", name)
	}
	_, err := netns.Dial(context.Background(), "bc-no-such-netns", "tcp", "127.0.0.1:1")
	require.Error(t, err)
}

// TestDialInsideOnly: a listener made inside a namespace is reached by
// Dial into it and not from the host, and the thread comes back.
func TestDialInsideOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to add a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2)")
	}
	name := fmt.Sprintf("bcnstest%d", os.Getpid()%100000)
	out, err := exec.Command("ip", "netns", "add", name).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	require.NoError(t, exec.Command("ip", "-n", name, "link", "set", "lo", "up").Run())

	var ln net.Listener
	require.NoError(t, netns.Do(name, func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}))
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("inside\n"))
			_ = c.Close()
		}
	}()
	c, err := netns.Dial(context.Background(), name, "tcp", ln.Addr().String())
	require.NoError(t, err)
	buf := make([]byte, 7)
	_, err = c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "inside\n", string(buf))
	_ = c.Close()

	// The host's loopback has no such listener (a refused or another
	// server's answer, never this one's).
	if h, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		b := make([]byte, 7)
		n, _ := h.Read(b)
		require.NotEqual(t, "inside\n", string(b[:n]))
		_ = h.Close()
	}
}
