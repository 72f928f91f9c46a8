//go:build !unix

package cli

import (
	"context"

	"github.com/better-compute/better-compute/internal/sshca"
)

// watchResize: without SIGWINCH the guest keeps the size it started with.
func watchResize(context.Context, localTerminal, chan sshca.WindowSize) {}
