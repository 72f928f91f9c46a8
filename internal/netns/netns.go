// Package netns runs code and opens sockets inside a named network
// namespace (/run/netns/NAME, as `ip netns add` makes): bcd reaches guests
// on a bridge kept in a namespace of its own, and the real-machine tests
// reach theirs the same way.
//
// A socket keeps the namespace it was made in, so only its creation runs
// on a thread switched into the namespace; the thread switches back
// afterwards, and one that cannot is never reused (it stays locked and
// exits with its goroutine).
package netns

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// Dir is where named network namespaces are mounted.
const Dir = "/run/netns"

// Do runs fn on the calling goroutine's thread moved into namespace name;
// sockets fn makes stay in it.
func Do(name string, fn func() error) (err error) {
	if name == "" || name == "." || name == ".." || filepath.Base(name) != name {
		return fmt.Errorf("netns: %q is not a namespace name", name)
	}
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: this thread's namespace: %w", err)
	}
	defer func() { _ = self.Close() }()
	target, err := os.Open(filepath.Join(Dir, name))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: %w", err)
	}
	defer func() { _ = target.Close() }()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: enter %s: %w", name, err)
	}
	defer func() {
		if rerr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); rerr != nil {
			// Locked still: the thread dies with the goroutine.
			err = fmt.Errorf("netns: leave %s: %w", name, rerr)
			return
		}
		runtime.UnlockOSThread()
	}()
	return fn()
}

// Dial connects from inside namespace name (the host's when name is "").
func Dial(ctx context.Context, name, network, addr string) (net.Conn, error) {
	var d net.Dialer
	if name == "" {
		return d.DialContext(ctx, network, addr)
	}
	var conn net.Conn
	err := Do(name, func() error {
		var derr error
		conn, derr = d.DialContext(ctx, network, addr)
		return derr
	})
	if err != nil {
		if conn != nil {
			_ = conn.Close()
		}
		return nil, err
	}
	return conn, nil
}

// Dialer is Dial bound to one namespace, in the shape clients take.
func Dialer(name string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return Dial(ctx, name, network, addr)
	}
}
