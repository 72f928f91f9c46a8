// Command better-compute is the control plane (serve, dev) and the operator
// CLI in one binary. It only hands its arguments to the CLI package.
package main

import (
	"os"

	"github.com/better-compute/better-compute/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}
