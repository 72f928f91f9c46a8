package migplan

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/capacity/placement"
)

const (
	h100 = "H100 80GB"
	p1   = "1g.10gb"
	p3   = "3g.40gb"
	p7   = "7g.80gb"
)

func split1g() []string { return []string{p1, p1, p1, p1, p1, p1, p1} }

func gpus(n int, layout []string, idle bool) []GPU {
	out := make([]GPU, n)
	for i := range out {
		out[i] = GPU{UUID: fmt.Sprintf("GPU-%03d", i), Model: h100, Layout: slices.Clone(layout), Idle: idle}
	}
	return out
}

func TestLayoutsFollowNVIDIAsArithmetic(t *testing.T) {
	t.Parallel()
	for _, want := range [][]string{
		{p7}, {p3, p3}, {"4g.40gb", p3}, {p3, "2g.20gb", p1, p1}, split1g(), {"4g.40gb", "2g.20gb", p1},
	} {
		require.True(t, Valid(h100, want), "%s is a valid H100 layout", Key(want))
	}
	for _, bad := range [][]string{
		{p7, p1}, {p3, p3, p1}, {"4g.40gb", "4g.40gb"}, {p3, p3, p3}, {p1, p1, p1, p1, p1, p1, p1, p1},
		{p3, p1, p1}, // not maximal: another 1g fits
	} {
		require.False(t, Valid(h100, bad), "%s is not a valid H100 layout", Key(bad))
	}
	require.Nil(t, Layouts("L40S"), "a model without MIG has no layouts")
	require.True(t, Valid("h100", []string{p3, p3}), "models match as placement matches them")
}

// TestGeometryMatchesPlacementsCatalogue keeps the slice table and
// placement's MIG catalogue in step: the same profiles per model, and the
// most instances of each in any layout is the catalogue's maximum.
func TestGeometryMatchesPlacementsCatalogue(t *testing.T) {
	t.Parallel()
	for model, g := range geometries {
		cat := placement.MIGProfiles(model)
		require.Len(t, g.Profiles, len(cat), model)
		for _, p := range cat {
			most := 0
			for _, l := range Layouts(model) {
				most = max(most, count(l)[p.Name])
			}
			require.Equal(t, p.MaxInstances, most, "%s %s", model, p.Name)
		}
		for _, l := range Layouts(model) {
			require.LessOrEqual(t, slicesUsed(model, l), g.Compute, "%s %s", model, Key(l))
		}
	}
}

func TestPropose(t *testing.T) {
	t.Parallel()
	busy := gpus(2, split1g(), false)
	for i := range busy {
		busy[i].UUID = fmt.Sprintf("BUSY-%d", i)
		busy[i].Free = map[string]int{p1: 3}
	}
	tests := []struct {
		name   string
		gpus   []GPU
		demand []Demand
		max    int
		want   []string // "uuid=layout"
	}{{
		name:   "a queued 7g on GPUs all split into 1g takes one idle GPU",
		gpus:   gpus(4, split1g(), true),
		demand: []Demand{{Model: "H100", Profile: p7, Count: 1}},
		want:   []string{"GPU-000=7g.80gb"},
	}, {
		name:   "busy GPUs are never touched",
		gpus:   append(gpus(1, split1g(), true), busy...),
		demand: []Demand{{Profile: p7, Count: 3}},
		want:   []string{"GPU-000=7g.80gb"},
	}, {
		name:   "at most MaxMoves GPUs a round",
		gpus:   gpus(8, split1g(), true),
		demand: []Demand{{Profile: p7, Count: 5}},
		max:    2,
		want:   []string{"GPU-000=7g.80gb", "GPU-001=7g.80gb"},
	}, {
		name:   "demand that free instances already meet moves nothing",
		gpus:   append(gpus(2, []string{p7}, true), busy...),
		demand: []Demand{{Profile: p1, Count: 6}, {Profile: p7, Count: 1}},
	}, {
		name:   "free 1g instances on busy GPUs count as supply",
		gpus:   append(gpus(1, []string{p7}, true), busy...),
		demand: []Demand{{Profile: p1, Count: 6}},
	}, {
		name:   "3g demand takes a GPU to 3g+3g and 7g demand wins a tie over it by slices",
		gpus:   gpus(2, split1g(), true),
		demand: []Demand{{Profile: p3, Count: 2}, {Profile: p7, Count: 1}},
		want:   []string{"GPU-000=7g.80gb", "GPU-001=3g.40gb+3g.40gb"},
	}, {
		name:   "a move that would starve more demand than it serves is not made",
		gpus:   gpus(1, split1g(), true),
		demand: []Demand{{Profile: p1, Count: 7}, {Profile: p7, Count: 1}},
	}, {
		name:   "demand for another model moves nothing",
		gpus:   gpus(2, split1g(), true),
		demand: []Demand{{Model: "A100 40GB", Profile: "7g.40gb", Count: 2}},
	}, {
		name:   "frozen GPUs neither move nor serve",
		gpus:   []GPU{{UUID: "A", Model: h100, Layout: []string{p7}, Idle: true, Frozen: true}, {UUID: "B", Model: h100, Layout: split1g(), Idle: true}},
		demand: []Demand{{Profile: p7, Count: 1}},
		want:   []string{"B=7g.80gb"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, m := range Propose(Params{GPUs: tt.gpus, Demand: tt.demand, MaxMoves: tt.max}) {
				got = append(got, m.UUID+"="+Key(m.To))
			}
			require.Equal(t, tt.want, got)
		})
	}
}
