package placement

import "math"

// Weights weigh the scorers into a plan's total score.
type Weights struct {
	Binpack       float64
	Topology      float64
	Fragmentation float64
	Spread        float64
}

// DefaultWeights favours topology (NVLink island, NUMA locality) first,
// then packing nodes full and keeping islands whole, and lightly spreads
// one tenant's atoms over nodes.
var DefaultWeights = Weights{Binpack: 1, Topology: 2, Fragmentation: 1, Spread: 0.5}

// scoreBinpack prefers nodes that end up fuller in the requested kind of
// atom, so whole nodes stay free for large requests.
func scoreBinpack(want int, p *pick) float64 {
	if p.unitsTotal == 0 {
		return 0
	}
	return float64(p.unitsTotal-p.unitsFree+want) / float64(p.unitsTotal)
}

// scoreTopology rewards one NVLink island (or one GPU for MIG and slots)
// and one NUMA node shared by the GPUs and the pinned CPUs.
func scoreTopology(p *pick) float64 {
	var s float64
	if p.islands <= 1 && (p.islands == 1 || p.gpus <= 1) {
		s += 0.5
	}
	if p.numa >= 0 && p.cpusLocal {
		s += 0.5
	}
	return s
}

// scoreFragmentation prefers the pick that leaves the fewest free atoms
// stranded in the islands or GPUs it breaks into.
func scoreFragmentation(p *pick) float64 { return 1 / (1 + float64(p.leftover)) }

// scoreSpread prefers nodes where the tenant holds fewer atoms already.
func scoreSpread(req *Request, d *digest) float64 {
	return 1 / (1 + float64(d.tenantAtoms(req.Tenant)))
}

func score(w Weights, req *Request, d *digest, p *pick) ScoreBreakdown {
	want := req.GPUs
	if req.Slots > 0 {
		want = req.Slots
	}
	b := ScoreBreakdown{
		Binpack:       scoreBinpack(want, p),
		Topology:      scoreTopology(p),
		Fragmentation: scoreFragmentation(p),
		Spread:        scoreSpread(req, d),
	}
	b.Total = weighted(&w, &b)
	return b
}

// weighted is the weighted total of b's scores. It is kept out of line so
// that every score and the scan's bound (see Place) are rounded by the same
// code: a compiler may fuse a multiply and an add differently where it
// inlines, and the bound must never round below a score.
//
//go:noinline
func weighted(w *Weights, b *ScoreBreakdown) float64 {
	sum := w.Binpack + w.Topology + w.Fragmentation + w.Spread
	if sum > 0 {
		return (w.Binpack*b.Binpack + w.Topology*b.Topology + w.Fragmentation*b.Fragmentation + w.Spread*b.Spread) / sum
	}
	return 0
}

// boundable reports whether a total can be bounded above by putting each
// score at its maximum: the weights are finite and not negative, so the
// total only grows with each score, in floating point too (each rounding
// is monotone).
func boundable(w *Weights) bool {
	for _, x := range []float64{w.Binpack, w.Topology, w.Fragmentation, w.Spread} {
		if !(x >= 0) || math.IsInf(x, 1) {
			return false
		}
	}
	return true
}
