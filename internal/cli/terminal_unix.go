//go:build unix

package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/better-compute/better-compute/internal/sshca"
)

// watchResize sends t's size on each SIGWINCH until ctx ends.
func watchResize(ctx context.Context, t localTerminal, sizes chan sshca.WindowSize) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		defer signal.Stop(winch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-winch:
				sendLatest(sizes, t.size())
			}
		}
	}()
}
