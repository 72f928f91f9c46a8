package migplan

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/internal/capacity/placement"
)

// DefaultMaxMoves is how many GPUs one round repartitions when Params.MaxMoves
// is zero.
const DefaultMaxMoves = 4

// GPU is one GPU of the pool as the planner sees it.
type GPU struct {
	UUID  string
	Model string
	// Layout is the profile of each GPU instance the node reports.
	Layout []string
	// Free counts the instances of each profile free for booking; nil
	// means all of Layout is free (an idle GPU).
	Free map[string]int
	// Idle is set when no atom of the GPU is booked.
	Idle bool
	// Frozen is set while the GPU is partition pending or quarantined: its
	// instances serve nothing and it is not moved again.
	Frozen bool
}

// Demand is the unmet requests for one MIG profile over the window: those
// still queued and those refused for want of capacity.
type Demand struct {
	// Model is the GPU model asked for; empty matches any model that
	// offers the profile.
	Model   string
	Profile string
	Count   int
}

// Params is one planning round's input.
type Params struct {
	GPUs   []GPU
	Demand []Demand
	// MaxMoves caps the GPUs repartitioned in one round; zero means
	// DefaultMaxMoves.
	MaxMoves int
}

// Move is one proposal: give GPU UUID the layout To.
type Move struct {
	UUID  string
	Model string
	From  []string
	To    []string
	// Gain is how much unmet demand, in compute slices, the move serves.
	Gain int
}

// Propose returns the moves for one round, best first. Each move takes an
// idle, unfrozen GPU to a layout of its model's table, and is made only when
// it lowers the unmet demand (demand less the free instances that can serve
// it, weighted by compute slices) counted after the moves before it. The
// result depends on the input only (ties go to the lower UUID, then the
// layout key).
func Propose(p Params) []Move {
	maxMoves := cmp.Or(p.MaxMoves, DefaultMaxMoves)
	var demand []Demand
	for _, d := range p.Demand {
		if d.Count > 0 && d.Profile != "" {
			demand = append(demand, d)
		}
	}
	if len(demand) == 0 || maxMoves <= 0 {
		return nil
	}
	// Free instances serve the demand first, whatever GPU they sit on.
	st := newSupply(demand)
	for i := range p.GPUs {
		if g := &p.GPUs[i]; !g.Frozen {
			st.add(g.Model, free(g), +1)
		}
	}
	// Idle GPUs with the same model and layout are interchangeable; the
	// lowest UUID of each group moves first.
	type group struct {
		model  string
		layout []string
		uuids  []string
	}
	byKey := map[string]*group{}
	var groups []*group
	for i := range p.GPUs {
		g := &p.GPUs[i]
		if !g.Idle || g.Frozen || Layouts(g.Model) == nil {
			continue
		}
		k := g.Model + "|" + Key(g.Layout)
		gr, ok := byKey[k]
		if !ok {
			gr = &group{model: g.Model, layout: canonical(g.Layout)}
			byKey[k] = gr
			groups = append(groups, gr)
		}
		gr.uuids = append(gr.uuids, g.UUID)
	}
	for _, gr := range groups {
		slices.Sort(gr.uuids)
	}
	// Greedy, one GPU at a time; a GPU already moved this round stays a
	// candidate (from its planned layout) so a later move can correct an
	// earlier choice without counting twice against MaxMoves. Each step
	// lowers the unmet demand, so the loop ends.
	var moves []*Move
	for {
		var best *Move
		var bestGr *group
		bestTie := 0
		consider := func(gr *group, uuid string, layout []string) {
			from := count(layout)
			for _, to := range Layouts(gr.model) {
				if Key(to) == Key(layout) {
					continue
				}
				gain := st.gain(gr.model, from, count(to))
				if gain <= 0 {
					continue
				}
				// Ties: the layout that uses more of the GPU, then the one
				// that keeps more of what the GPU had, then UUID and key.
				tie := 100*slicesUsed(gr.model, to) + overlap(layout, to)
				m := Move{UUID: uuid, Model: gr.model, From: layout, To: to, Gain: gain}
				if best == nil || better(&m, tie, best, bestTie) {
					best, bestGr, bestTie = &m, gr, tie
				}
			}
		}
		if len(moves) < maxMoves {
			for _, gr := range groups {
				if len(gr.uuids) > 0 && st.anyUnmet(gr.model) {
					consider(gr, gr.uuids[0], gr.layout)
				}
			}
		}
		for _, m := range moves {
			if st.anyUnmet(m.Model) {
				consider(&group{model: m.Model}, m.UUID, m.To)
			}
		}
		if best == nil {
			break
		}
		st.add(best.Model, count(best.From), -1)
		st.add(best.Model, count(best.To), +1)
		if i := slices.IndexFunc(moves, func(m *Move) bool { return m.UUID == best.UUID }); i >= 0 {
			moves[i].To, moves[i].Gain = best.To, moves[i].Gain+best.Gain
			continue
		}
		best.From = slices.Clone(best.From)
		bestGr.uuids = bestGr.uuids[1:]
		moves = append(moves, best)
	}
	out := make([]Move, 0, len(moves))
	for _, m := range moves {
		if Key(m.From) != Key(m.To) {
			out = append(out, *m)
		}
	}
	return out
}

func better(a *Move, aTie int, b *Move, bTie int) bool {
	return cmp.Or(
		cmp.Compare(b.Gain, a.Gain),
		cmp.Compare(bTie, aTie),
		cmp.Compare(a.UUID, b.UUID),
		cmp.Compare(Key(a.To), Key(b.To)),
	) < 0
}

// free is the instances of g free for booking, by profile.
func free(g *GPU) map[string]int {
	if g.Free != nil {
		return g.Free
	}
	return count(g.Layout)
}

func count(layout []string) map[string]int {
	out := map[string]int{}
	for _, p := range layout {
		out[p]++
	}
	return out
}

func matches(want, model string) bool { return want == "" || placement.ModelMatches(want, model) }

// supply is the free instances per GPU model and profile, and the demand
// they meet.
type supply struct {
	demand []Demand // most specific model first
	free   map[string]map[string]int
}

// newSupply orders demand so that a demand naming an exact model comes
// before one naming a family ("H100") and that before one taking any
// model: the sets of models they match nest, so meeting the narrower ones
// first from what matches them meets the most demand there is.
func newSupply(demand []Demand) *supply {
	spec := func(d Demand) int {
		switch {
		case d.Model == "":
			return 2
		case strings.Contains(d.Model, " "):
			return 0
		}
		return 1
	}
	ds := slices.Clone(demand)
	slices.SortStableFunc(ds, func(a, b Demand) int { return cmp.Compare(spec(a), spec(b)) })
	return &supply{demand: ds, free: map[string]map[string]int{}}
}

func (s *supply) add(model string, inst map[string]int, sign int) {
	m := s.free[model]
	if m == nil {
		m = map[string]int{}
		s.free[model] = m
	}
	for p, n := range inst {
		m[p] += sign * n
	}
}

// unmet is what is left of each demand once the free instances meet what
// they can, in s.demand's order.
func (s *supply) unmet() []int {
	left := map[string]map[string]int{}
	for m, ps := range s.free {
		left[m] = maps.Clone(ps)
	}
	models := slices.Sorted(maps.Keys(left))
	out := make([]int, len(s.demand))
	for i, d := range s.demand {
		need := d.Count
		for _, m := range models {
			if need == 0 {
				break
			}
			if !matches(d.Model, m) {
				continue
			}
			take := min(need, max(left[m][d.Profile], 0))
			left[m][d.Profile] -= take
			need -= take
		}
		out[i] = need
	}
	return out
}

// unmetSlices weighs the unmet demand by the compute slices of its
// profile, so a 7g request counts as much as seven 1g ones.
func (s *supply) unmetSlices() int {
	n := 0
	for i, u := range s.unmet() {
		n += u * max(sliceCount(s.demand[i].Profile), 1)
	}
	return n
}

func (s *supply) anyUnmet(model string) bool {
	for i, u := range s.unmet() {
		if u > 0 && matches(s.demand[i].Model, model) {
			return true
		}
	}
	return false
}

// gain is how much the unmet demand, in compute slices, drops when a GPU of
// model goes from layout from to layout to.
func (s *supply) gain(model string, from, to map[string]int) int {
	before := s.unmetSlices()
	s.add(model, from, -1)
	s.add(model, to, +1)
	after := s.unmetSlices()
	s.add(model, to, -1)
	s.add(model, from, +1)
	return before - after
}

func slicesUsed(model string, layout []string) int {
	n := 0
	for _, p := range layout {
		n += Compute(model, p)
	}
	return n
}

func overlap(a, b []string) int {
	ca, n := count(a), 0
	for _, p := range b {
		if ca[p] > 0 {
			ca[p]--
			n++
		}
	}
	return n
}
