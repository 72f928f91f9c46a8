package migsim

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// phases shift the mix from mostly 1g to mostly 7g to mostly 3g and back.
var phases = []Phase{
	{"mostly 1g", 720, [3]float64{0.7, 0.2, 0.1}},
	{"mostly 7g", 720, [3]float64{0.1, 0.2, 0.7}},
	{"mostly 3g", 720, [3]float64{0.2, 0.7, 0.1}},
	{"mostly 1g again", 720, [3]float64{0.7, 0.2, 0.1}},
}

func split(n7, n33, n1 int) [][]string {
	var out [][]string
	for range n7 {
		out = append(out, []string{p7})
	}
	for range n33 {
		out = append(out, []string{p3, p3})
	}
	for range n1 {
		out = append(out, []string{p1, p1, p1, p1, p1, p1, p1})
	}
	return out
}

func config(nodes int) Config {
	return Config{
		Seed: 1, Nodes: nodes, GPUsPerNode: 8, Phases: slices.Clone(phases), Load: 0.85,
		HoldMin: 30, HoldMax: 210, Wait: 15,
		// 5×7g, 2×3g+3g, 1×7×1g: the split that matches the run's average
		// demand in compute slices.
		Layout: split(5, 2, 1),
		Round:  5, MaxMoves: 32, Delay: 2,
	}
}

func share(a, b int) string { return fmt.Sprintf("%5.1f%%", 100*float64(a)/float64(max(b, 1))) }

func report(t *testing.T, name string, r Result) {
	t.Logf("%-36s requests %6d  placed at once %s  within wait %s  booked/offered slice-min %5.1f%%  repartitions %5d  frozen GPU-h %6.1f",
		name, r.Requests, share(r.Immediate, r.Requests), share(r.WithinWait, r.Requests), 100*r.SliceMinutes, r.Repartitions, r.FrozenGPUHours)
	var ph, pp []string
	for _, p := range r.PerPhase {
		ph = append(ph, fmt.Sprintf("%s %s", p.Name, share(p.Placed, p.Requests)))
	}
	for _, p := range profiles {
		pp = append(pp, fmt.Sprintf("%s %s", p, share(r.PerProfile[p][0], r.PerProfile[p][1])))
	}
	t.Logf("%-36s   by phase: %s", "", strings.Join(ph, ", "))
	t.Logf("%-36s   by profile: %s", "", strings.Join(pp, ", "))
}

// TestMIGSim compares fixed layouts with auto on a pool of 125 nodes × 8
// H100 (BC_MIGSIM_NODES changes the size) over four shifting phases.
func TestMIGSim(t *testing.T) {
	t.Parallel()
	nodes := 125
	if v := os.Getenv("BC_MIGSIM_NODES"); v != "" {
		_, err := fmt.Sscan(v, &nodes)
		require.NoError(t, err)
	}
	mixed := config(nodes)
	allMixed := config(nodes)
	allMixed.Layout = [][]string{{p3, "2g.20gb", p1, p1}}
	auto := config(nodes)
	auto.Auto = true
	slow := auto
	slow.MaxMoves, slow.Delay = 8, 10
	runs := []struct {
		name string
		cfg  Config
	}{
		{"fixed 5×7g, 2×(3g+3g), 1×7×1g", mixed},
		{"fixed 3g+2g+1g+1g on every GPU", allMixed},
		{"auto, 32 moves/5 min, 2 min frozen", auto},
		{"auto, 8 moves/5 min, 10 min frozen", slow},
	}
	results := make([]Result, len(runs))
	for i, r := range runs {
		res, err := Run(r.cfg)
		require.NoError(t, err)
		results[i] = res
		report(t, r.name, res)
	}
	best := max(results[0].WithinWait, results[1].WithinWait)
	require.Greater(t, results[2].WithinWait, best, "auto places more than either fixed layout")
	require.Greater(t, results[3].WithinWait, best, "auto places more than either fixed layout")
}

// TestMIGSimDeterministic: one seed, one result.
func TestMIGSimDeterministic(t *testing.T) {
	t.Parallel()
	cfg := config(12)
	cfg.Auto = true
	for i := range cfg.Phases {
		cfg.Phases[i].Minutes = 120
	}
	a, err := Run(cfg)
	require.NoError(t, err)
	b, err := Run(cfg)
	require.NoError(t, err)
	require.Equal(t, a, b)
	require.Positive(t, a.Repartitions)
}
