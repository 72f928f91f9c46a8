// Package gpumodel names GPU models the way capacity does: the product
// name ("H100") that the derived gpu.model label carries and requests name,
// the canonical "H100 80GB" that tells MIG layouts apart, and the labels a
// node's inventory gives it.
//
// It is a leaf: pure functions over strings, so fleet and capacity can both
// use it without importing each other. It must never touch the database.
package gpumodel

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// shortRE finds the product name in a marketing name such as
// "NVIDIA H100 80GB HBM3" or "NVIDIA A100-SXM4-40GB".
var shortRE = regexp.MustCompile(`\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b`)

// Short is a GPU's product name ("H100"), the value of the derived
// gpu.model label and what requests name. Unknown names are returned as is.
func Short(name string) string {
	if m := shortRE.FindStringSubmatch(strings.ToUpper(name)); m != nil {
		return m[1]
	}
	return strings.TrimSpace(name)
}

// Canonical is "<short> <memory>GB" ("H100 80GB"): it tells MIG layouts
// apart (an A100 40GB and 80GB have different profiles) and still matches a
// request for "H100" (placement.ModelMatches).
func Canonical(name string, memoryMiB int) string {
	short := Short(name)
	if memoryMiB <= 0 {
		return short
	}
	return fmt.Sprintf("%s %dGB", short, int(math.Round(float64(memoryMiB)/1024)))
}

// Labels are the labels a node's inventory gives it: gpu.model, gpu.count
// and, when the memory is known, gpu.memory, from its first GPU's name and
// memory and its GPU count. None without GPUs.
func Labels(gpuName string, gpus, memMiB int) map[string]string {
	out := make(map[string]string, 3)
	if gpus == 0 {
		return out
	}
	out["gpu.model"] = Short(gpuName)
	out["gpu.count"] = strconv.Itoa(gpus)
	if memMiB > 0 {
		out["gpu.memory"] = fmt.Sprintf("%dGB", int(math.Round(float64(memMiB)/1024)))
	}
	return out
}
