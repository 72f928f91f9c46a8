// Command bmc-driver is an out-of-process BMC driver: the site agent's
// built-in IPMI driver served through pkg/driver, as a third party's
// driver binary would be. The site agent starts it as
// "plugin:/path/to/bmc-driver" or from its drivers directory; run by
// hand, it says it is a driver and exits.
//
// It is the worked example for docs/drivers.md and the binary the BMC
// driver suite runs out of process. It must never print a BMC password:
// the driver it serves never logs one, and the host scrubs what it gets.
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/better-compute/better-compute/internal/metal/bmc"
	"github.com/better-compute/better-compute/pkg/driver"
)

func main() {
	// The logger writes to the real stderr, which the host parses into
	// its own logger: build it before ServeBMC redirects os.Stderr. Debug
	// lines (one per BMC call) go over; the host's level decides.
	log := driver.NewLogger(slog.LevelDebug)
	impl, err := bmc.Served("ipmi", log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	driver.ServeBMC(impl)
}
