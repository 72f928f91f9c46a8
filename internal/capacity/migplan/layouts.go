package migplan

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"github.com/better-compute/better-compute/internal/capacity/placement"
)

// profileShape is where a GPU instance profile may sit on a GPU: the compute
// slices it takes, the memory slices it spans and the memory slices it may
// start at (NVIDIA MIG user guide, "A100/H100 MIG profiles" placements).
type profileShape struct {
	Name    string
	Compute int
	Memory  int
	Starts  []int
}

// geometry is one GPU model family's slices and profile shapes.
type geometry struct {
	Compute, Memory int
	Profiles        []profileShape
}

// fullSlices is the geometry of the GPUs with 7 compute slices and 8 memory
// slices (A100, H100); names are the model's profile names, smallest first.
func fullSlices(p1, p1m, p2, p3, p4, p7 string) geometry {
	return geometry{Compute: 7, Memory: 8, Profiles: []profileShape{
		{p1, 1, 1, []int{0, 1, 2, 3, 4, 5, 6}},
		{p1m, 1, 2, []int{0, 2, 4, 6}},
		{p2, 2, 2, []int{0, 2, 4}},
		{p3, 3, 4, []int{0, 4}},
		{p4, 4, 4, []int{0}},
		{p7, 7, 8, []int{0}},
	}}
}

// geometries holds one entry per MIG model of placement's catalogue; a test
// keeps the two in step.
var geometries = map[string]geometry{
	"H100 80GB": fullSlices("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
	"A100 80GB": fullSlices("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
	"A100 40GB": fullSlices("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
}

// geometryFor returns the geometry of model, matched as placement matches
// models, and its table key.
func geometryFor(model string) (geometry, string, bool) {
	for m, g := range geometries {
		if placement.ModelMatches(model, m) {
			return g, m, true
		}
	}
	return geometry{}, "", false
}

// Compute returns the compute slices profile takes on a GPU of model, or 0
// when the model does not offer it.
func Compute(model, profile string) int {
	g, _, ok := geometryFor(model)
	if !ok {
		return 0
	}
	for _, p := range g.Profiles {
		if p.Name == profile {
			return p.Compute
		}
	}
	return 0
}

var (
	layoutsOnce sync.Once
	layoutTable map[string][][]string // model key → layouts, canonical order
)

// Layouts returns every full-or-partial MIG layout a GPU of model can hold
// that cannot take one more instance (maximal layouts): the valid-combination
// table proposals are drawn from. Each layout is in canonical order (largest
// profile first). It returns nil for a model without MIG.
func Layouts(model string) [][]string {
	layoutsOnce.Do(func() {
		layoutTable = map[string][][]string{}
		for m, g := range geometries {
			layoutTable[m] = enumerate(g)
		}
	})
	_, key, ok := geometryFor(model)
	if !ok {
		return nil
	}
	out := make([][]string, len(layoutTable[key]))
	for i, l := range layoutTable[key] {
		out[i] = slices.Clone(l)
	}
	return out
}

// Valid reports whether layout, in any order, is in model's table.
func Valid(model string, layout []string) bool {
	k := Key(layout)
	for _, l := range Layouts(model) {
		if Key(l) == k {
			return true
		}
	}
	return false
}

// Key is a layout's canonical spelling, e.g. "3g.40gb+2g.20gb+1g.10gb+1g.10gb".
func Key(layout []string) string { return strings.Join(canonical(layout), "+") }

// canonical sorts a layout largest profile first, then by name.
func canonical(layout []string) []string {
	out := slices.Clone(layout)
	slices.SortFunc(out, func(a, b string) int {
		return cmp.Or(cmp.Compare(sliceCount(b), sliceCount(a)), cmp.Compare(a, b))
	})
	return out
}

// sliceCount reads the compute slices from a profile name ("3g.40gb" → 3).
func sliceCount(profile string) int {
	n := 0
	for _, c := range profile {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// enumerate places profiles on the memory slices by their start positions,
// within the compute slices, and keeps the maximal layouts.
func enumerate(g geometry) [][]string {
	seen := map[string]bool{}
	var out [][]string
	used := make([]bool, g.Memory)
	var cur []string
	var walk func(from, compute int)
	walk = func(from, compute int) {
		grew := false
		for pi := range g.Profiles {
			p := &g.Profiles[pi]
			if compute+p.Compute > g.Compute {
				continue
			}
			for _, s := range p.Starts {
				if !fits(used, s, p.Memory) {
					continue
				}
				grew = true
				// Only place at or after from (by profile, then start) so
				// each set of placements is visited once.
				if pi*g.Memory+s < from {
					continue
				}
				mark(used, s, p.Memory, true)
				cur = append(cur, p.Name)
				walk(pi*g.Memory+s+1, compute+p.Compute)
				cur = cur[:len(cur)-1]
				mark(used, s, p.Memory, false)
			}
		}
		if !grew && len(cur) > 0 {
			if k := Key(cur); !seen[k] {
				seen[k] = true
				out = append(out, canonical(cur))
			}
		}
	}
	walk(0, 0)
	slices.SortFunc(out, func(a, b []string) int { return cmp.Compare(strings.Join(a, "+"), strings.Join(b, "+")) })
	return out
}

func fits(used []bool, start, n int) bool {
	if start+n > len(used) {
		return false
	}
	for i := start; i < start+n; i++ {
		if used[i] {
			return false
		}
	}
	return true
}

func mark(used []bool, start, n int, v bool) {
	for i := start; i < start+n; i++ {
		used[i] = v
	}
}
