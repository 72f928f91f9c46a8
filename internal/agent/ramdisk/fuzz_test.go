package ramdisk_test

import (
	"strings"
	"testing"

	"github.com/better-compute/better-compute/internal/agent/ramdisk"
)

// FuzzParseCmdline: the kernel command line is the site's to write; the
// parser must not panic, and what it returns came from the line.
func FuzzParseCmdline(f *testing.F) {
	f.Add("console=ttyS0 bc.server=10.0.2.2:8443 bc.token=bcdt_ab.cd quiet")
	f.Add("bc.token= bc.server=")
	f.Add("bc.token=a=b=c bc.server=[::1]:1")
	f.Fuzz(func(t *testing.T, line string) {
		b, err := ramdisk.ParseCmdline(line)
		if err != nil {
			return
		}
		if !strings.Contains(line, b.Token) || !strings.Contains(line, b.Server) {
			t.Fatalf("parsed %+v from %q", b, line)
		}
	})
}
