package reservation

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// shortModelRE finds the product name in a marketing name such as
// "NVIDIA H100 80GB HBM3" or "NVIDIA A100-SXM4-40GB".
var shortModelRE = regexp.MustCompile(`\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b`)

// ShortModel is a GPU's product name ("H100"), the value of the derived
// gpu.model label and what requests name. Unknown names are returned as is.
func ShortModel(name string) string {
	if m := shortModelRE.FindStringSubmatch(strings.ToUpper(name)); m != nil {
		return m[1]
	}
	return strings.TrimSpace(name)
}

// CanonicalModel is "<short> <memory>GB" ("H100 80GB"): it tells MIG layouts
// apart (an A100 40GB and 80GB have different profiles) and still matches a
// request for "H100" (placement.ModelMatches).
func CanonicalModel(name string, memoryMiB int) string {
	short := ShortModel(name)
	if memoryMiB <= 0 {
		return short
	}
	return fmt.Sprintf("%s %dGB", short, int(math.Round(float64(memoryMiB)/1024)))
}

// parseCPUList parses a kernel CPU list ("0-3,8,10-11").
func parseCPUList(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("cpu list %q: %w", s, err)
			}
		}
		if b < a || b-a > 1<<16 {
			return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// formatCPUList writes CPUs in kernel list form.
func formatCPUList(cpus []int) string {
	cpus = slices.Clone(cpus)
	slices.Sort(cpus)
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j == i {
			fmt.Fprintf(&b, "%d", cpus[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", cpus[i], cpus[j])
		}
		i = j + 1
	}
	return b.String()
}

// cpuAtom names a CPU of a node as an atom.
func cpuAtom(nodeID string, cpu int) string { return nodeID + "/cpu/" + strconv.Itoa(cpu) }
