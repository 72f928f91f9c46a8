package migplan

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

var models = []string{"H100 80GB", "A100 80GB", "A100 40GB", "L40S"}

// genGPU draws a GPU with a layout from its model's table or a part of one
// (a node may report a layout mid-change), busy or idle, maybe frozen.
func genGPU(t *rapid.T, i int) GPU {
	model := rapid.SampledFrom(models).Draw(t, "model")
	g := GPU{UUID: fmt.Sprintf("GPU-%03d", i), Model: model, Idle: rapid.Bool().Draw(t, "idle"), Frozen: rapid.IntRange(0, 5).Draw(t, "frozen") == 0}
	if ls := Layouts(model); ls != nil {
		l := rapid.SampledFrom(ls).Draw(t, "layout")
		g.Layout = l[:rapid.IntRange(0, len(l)).Draw(t, "keep")]
	}
	if !g.Idle && len(g.Layout) > 0 {
		g.Free = map[string]int{}
		for _, p := range g.Layout[1:] {
			if rapid.Bool().Draw(t, "free") {
				g.Free[p]++
			}
		}
	}
	return g
}

func genParams(t *rapid.T) Params {
	var p Params
	for i := range rapid.IntRange(0, 24).Draw(t, "gpus") {
		p.GPUs = append(p.GPUs, genGPU(t, i))
	}
	for range rapid.IntRange(0, 6).Draw(t, "demands") {
		model := rapid.SampledFrom(append([]string{"", "H100", "A100"}, models...)).Draw(t, "dmodel")
		g, _, ok := geometryFor(rapid.SampledFrom(models[:3]).Draw(t, "pmodel"))
		if !ok {
			continue
		}
		p.Demand = append(p.Demand, Demand{Model: model, Profile: rapid.SampledFrom(g.Profiles).Draw(t, "profile").Name, Count: rapid.IntRange(0, 12).Draw(t, "count")})
	}
	p.MaxMoves = rapid.IntRange(0, 30).Draw(t, "max")
	return p
}

// TestProposalsTouchOnlyIdleGPUsWithValidLayouts: every move takes an idle,
// unfrozen GPU of the pool, once, to a layout in its model's table, serves
// some demand, and a round moves at most MaxMoves GPUs.
func TestProposalsTouchOnlyIdleGPUsWithValidLayouts(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		p := genParams(t)
		moves := Propose(p)
		limit := p.MaxMoves
		if limit == 0 {
			limit = DefaultMaxMoves
		}
		if len(moves) > limit {
			t.Fatalf("%d moves, limit %d", len(moves), limit)
		}
		seen := map[string]bool{}
		for _, m := range moves {
			i := slices.IndexFunc(p.GPUs, func(g GPU) bool { return g.UUID == m.UUID })
			if i < 0 {
				t.Fatalf("move of unknown GPU %s", m.UUID)
			}
			g := p.GPUs[i]
			if !g.Idle || g.Frozen {
				t.Fatalf("moved GPU %s: idle %v frozen %v", g.UUID, g.Idle, g.Frozen)
			}
			if seen[m.UUID] {
				t.Fatalf("GPU %s moved twice in a round", m.UUID)
			}
			seen[m.UUID] = true
			if !Valid(g.Model, m.To) {
				t.Fatalf("layout %s is not valid for %s", Key(m.To), g.Model)
			}
			if Key(m.From) != Key(g.Layout) || Key(m.To) == Key(g.Layout) {
				t.Fatalf("move %s → %s of a GPU with %s", Key(m.From), Key(m.To), Key(g.Layout))
			}
			if m.Gain <= 0 {
				t.Fatalf("move without gain: %+v", m)
			}
		}
	})
}

// TestProposalsSettle is the hysteresis: once a round's moves land, the
// same demand proposes nothing more, so balanced demand never flips a GPU
// back and forth; and demand the free instances already meet moves nothing.
func TestProposalsSettle(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		p := genParams(t)
		p.MaxMoves = len(p.GPUs) + 1
		moves := Propose(p)
		for _, m := range moves {
			i := slices.IndexFunc(p.GPUs, func(g GPU) bool { return g.UUID == m.UUID })
			p.GPUs[i].Layout = m.To
		}
		if again := Propose(p); len(again) > 0 {
			t.Fatalf("after %d moves %+v the same demand moves %s again to %s; %+v", len(moves), moves, again[0].UUID, Key(again[0].To), p)
		}
		// Demand no larger than the free instances of the idle GPUs moves nothing.
		var met []Demand
		for _, g := range p.GPUs {
			if g.Idle && !g.Frozen {
				for prof, n := range free(&g) {
					met = append(met, Demand{Model: g.Model, Profile: prof, Count: rapid.IntRange(0, n).Draw(t, "met")})
				}
			}
		}
		if got := Propose(Params{GPUs: p.GPUs, Demand: met, MaxMoves: p.MaxMoves}); len(got) > 0 {
			t.Fatalf("demand the free instances meet moved %s to %s", got[0].UUID, Key(got[0].To))
		}
	})
}
