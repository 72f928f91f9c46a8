// Command sbomprobe is a tiny program the release tests build to make an
// SBOM from a real Go binary with module dependencies.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"golang.org/x/mod/semver"
)

func main() {
	v := pflag.String("version", "v1.0.0", "a version")
	pflag.Parse()
	if !semver.IsValid(*v) {
		os.Exit(1)
	}
	fmt.Println(semver.Canonical(*v))
}
