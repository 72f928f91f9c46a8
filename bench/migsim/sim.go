package migsim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/internal/capacity/migplan"
	"github.com/better-compute/better-compute/internal/capacity/placement"
)

const (
	model = "H100 80GB"
	p1    = "1g.10gb"
	p3    = "3g.40gb"
	p7    = "7g.80gb"
)

// profiles are the profiles requests ask for, in report order.
var profiles = []string{p1, p3, p7}

// Phase is a stretch of the run with one request mix.
type Phase struct {
	Name    string
	Minutes int
	// Mix is the share of requests per profile, in profiles' order.
	Mix [3]float64
}

// Config is one simulation run.
type Config struct {
	Seed        uint64
	Nodes       int
	GPUsPerNode int
	Phases      []Phase
	// Load is the offered load as a share of the pool's compute slices;
	// the arrival rate of each phase follows from its mix.
	Load float64
	// HoldMin and HoldMax bound a request's duration, drawn uniformly.
	HoldMin, HoldMax int
	// Wait is how long a request may queue before it is refused.
	Wait int
	// Layout is each node's starting layout, one entry per GPU.
	Layout [][]string
	// Auto runs migplan every Round minutes, moving at most MaxMoves GPUs,
	// each frozen for Delay minutes.
	Auto     bool
	Round    int
	MaxMoves int
	Delay    int
}

// Result is what a run measured.
type Result struct {
	Requests       int
	Immediate      int // placed in the minute they arrived
	WithinWait     int // placed before Wait ran out
	Repartitions   int
	SliceMinutes   float64           // booked compute-slice minutes / offered ones
	PerProfile     map[string][2]int // placed within the wait bound, requests
	PerPhase       []PhaseResult
	FrozenGPUHours float64
}

// PhaseResult is the share placed within the wait bound per phase.
type PhaseResult struct {
	Name               string
	Requests, Placed   int
	ImmediatePlacement int
}

type request struct {
	id, profile, phase int
	arrive, hold       int
	// where it was booked, to release it
	node, gpu, inst int
}

type change struct {
	node, gpu int
	at        int
	layout    []string
}

type sim struct {
	cfg      Config
	rng      *rand.Rand
	nodes    []placement.Node
	byUUID   map[string][2]int
	snap     *placement.Snapshot
	dirty    map[int]bool
	queue    []*request
	running  []*request
	changes  []change
	refused  [][2]int // minute and profile of each refusal, for the demand window
	res      Result
	offered  float64
	booked   float64
	frozenGM int
}

// Run simulates cfg and returns what it measured.
func Run(cfg Config) (Result, error) {
	s := &sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6d6967)), byUUID: map[string][2]int{}, dirty: map[int]bool{}}
	s.res.PerProfile = map[string][2]int{}
	for n := range cfg.Nodes {
		node := placement.Node{ID: fmt.Sprintf("node-%04d", n), Name: fmt.Sprintf("h100-%04d", n), Pool: "mig",
			Schedulable: true, Healthy: true}
		for g := range cfg.GPUsPerNode {
			uuid := fmt.Sprintf("GPU-%04d-%d", n, g)
			node.GPUs = append(node.GPUs, placement.GPU{UUID: uuid, Model: model, Index: g, NUMA: g * 2 / cfg.GPUsPerNode,
				Island: 0, MemoryMiB: 81559, Mode: placement.ModeMIG, MIG: instances(cfg.Layout[g%len(cfg.Layout)])})
			s.byUUID[uuid] = [2]int{n, g}
		}
		s.nodes = append(s.nodes, node)
	}
	s.rebuild()
	capacity := float64(cfg.Nodes * cfg.GPUsPerNode * 7)
	now, id := 0, 0
	for ph, phase := range cfg.Phases {
		s.res.PerPhase = append(s.res.PerPhase, PhaseResult{Name: phase.Name})
		mean := 0.0
		for i, p := range profiles {
			mean += phase.Mix[i] * float64(slices7(p))
		}
		rate := cfg.Load * capacity / (mean * float64(cfg.HoldMin+cfg.HoldMax) / 2)
		for range phase.Minutes {
			s.land(now)
			s.release(now)
			for range poisson(s.rng, rate) {
				r := &request{id: id, profile: pick(s.rng, phase.Mix), phase: ph, arrive: now,
					hold: cfg.HoldMin + s.rng.IntN(cfg.HoldMax-cfg.HoldMin+1)}
				id++
				s.queue = append(s.queue, r)
				s.res.Requests++
				s.res.PerPhase[ph].Requests++
				s.offered += float64(slices7(profiles[r.profile]) * r.hold)
				pp := s.res.PerProfile[profiles[r.profile]]
				pp[1]++
				s.res.PerProfile[profiles[r.profile]] = pp
			}
			if err := s.place(now); err != nil {
				return Result{}, err
			}
			if cfg.Auto && now%cfg.Round == 0 {
				s.repartition(now)
			}
			s.frozenGM += len(s.changes)
			now++
		}
	}
	s.res.SliceMinutes = s.booked / s.offered
	s.res.FrozenGPUHours = float64(s.frozenGM) / 60
	return s.res, nil
}

// instances numbers a layout's instances per profile, as the atoms
// reconciler names them.
func instances(layout []string) []placement.MIGInstance {
	seen := map[string]int{}
	out := make([]placement.MIGInstance, 0, len(layout))
	for _, p := range layout {
		out = append(out, placement.MIGInstance{Profile: p, N: seen[p]})
		seen[p]++
	}
	return out
}

func slices7(profile string) int { return migplan.Compute(model, profile) }

func pick(rng *rand.Rand, mix [3]float64) int {
	x := rng.Float64()
	for i, m := range mix {
		if x < m {
			return i
		}
		x -= m
	}
	return len(mix) - 1
}

// poisson draws by Knuth's method, split so large rates do not underflow.
func poisson(rng *rand.Rand, rate float64) int {
	n := 0
	for rate > 0 {
		step := math.Min(rate, 30)
		rate -= step
		l, p := math.Exp(-step), 1.0
		for {
			p *= rng.Float64()
			if p <= l {
				break
			}
			n++
		}
	}
	return n
}

// rebuild indexes every node again; update replaces the changed ones.
func (s *sim) rebuild() {
	nodes := make([]placement.Node, len(s.nodes))
	for i := range s.nodes {
		nodes[i] = clone(&s.nodes[i])
	}
	s.snap = placement.NewSnapshot(nodes)
	clear(s.dirty)
}

func (s *sim) update() error {
	if len(s.dirty) > len(s.nodes)/4 {
		s.rebuild()
		return nil
	}
	for _, i := range sortedKeys(s.dirty) {
		n := clone(&s.nodes[i])
		snap, err := s.snap.Replace(&n)
		if err != nil {
			return err
		}
		s.snap = snap
	}
	clear(s.dirty)
	return nil
}

func clone(n *placement.Node) placement.Node {
	c := *n
	c.GPUs = slices.Clone(n.GPUs)
	for i := range c.GPUs {
		c.GPUs[i].MIG = slices.Clone(n.GPUs[i].MIG)
	}
	return c
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// land applies the layouts whose reconfiguration is done.
func (s *sim) land(now int) {
	kept := s.changes[:0]
	for _, c := range s.changes {
		if c.at > now {
			kept = append(kept, c)
			continue
		}
		g := &s.nodes[c.node].GPUs[c.gpu]
		g.MIG, g.PartitionPending = instances(c.layout), false
		s.dirty[c.node] = true
	}
	s.changes = kept
}

func (s *sim) release(now int) {
	kept := s.running[:0]
	for _, r := range s.running {
		if r.arrive+r.hold > now {
			kept = append(kept, r)
			continue
		}
		s.nodes[r.node].GPUs[r.gpu].MIG[r.inst].Booked = false
		s.dirty[r.node] = true
	}
	s.running = kept
}

// place tries the queue in arrival order. Requests for one profile are alike,
// so once one fails the rest of that profile wait for the next minute.
func (s *sim) place(now int) error {
	full := map[int]bool{}
	kept := s.queue[:0]
	for _, r := range s.queue {
		if !full[r.profile] {
			ok, err := s.placeOne(r, now)
			if err != nil {
				return err
			}
			if ok {
				continue
			}
			full[r.profile] = true
		}
		if now-r.arrive >= s.cfg.Wait {
			s.refused = append(s.refused, [2]int{now, r.profile})
			continue
		}
		kept = append(kept, r)
	}
	s.queue = kept
	return nil
}

func (s *sim) placeOne(r *request, now int) (bool, error) {
	if err := s.update(); err != nil {
		return false, err
	}
	res, err := placement.Place(s.snap, placement.Request{GPUs: 1, Model: "H100", MIGProfile: profiles[r.profile]}, placement.Options{Limit: 1})
	if err != nil || len(res.Plans) == 0 {
		return false, err
	}
	// <uuid>/mig/<profile>/<n>
	parts := strings.Split(res.Plans[0].Atoms[0], "/")
	at, ok := s.byUUID[parts[0]]
	n, err := strconv.Atoi(parts[len(parts)-1])
	if !ok || err != nil {
		return false, fmt.Errorf("migsim: unexpected atom %q", res.Plans[0].Atoms[0])
	}
	g := &s.nodes[at[0]].GPUs[at[1]]
	k := slices.IndexFunc(g.MIG, func(in placement.MIGInstance) bool { return in.Profile == parts[2] && in.N == n })
	if k < 0 || g.MIG[k].Booked || g.PartitionPending {
		return false, fmt.Errorf("migsim: placement chose %q, which is not free", res.Plans[0].Atoms[0])
	}
	g.MIG[k].Booked = true
	s.dirty[at[0]] = true
	r.node, r.gpu, r.inst = at[0], at[1], k
	s.running = append(s.running, r)
	s.booked += float64(slices7(profiles[r.profile]) * r.hold)
	if r.arrive == now {
		s.res.Immediate++
		s.res.PerPhase[r.phase].ImmediatePlacement++
	}
	s.res.WithinWait++
	s.res.PerPhase[r.phase].Placed++
	pp := s.res.PerProfile[profiles[r.profile]]
	pp[0]++
	s.res.PerProfile[profiles[r.profile]] = pp
	return true, nil
}

// repartition is one migplan round: demand is what is queued now plus what
// was refused over the last wait bound.
func (s *sim) repartition(now int) {
	count := map[int]int{}
	for _, r := range s.queue {
		count[r.profile]++
	}
	for i := len(s.refused) - 1; i >= 0 && s.refused[i][0] > now-s.cfg.Wait; i-- {
		count[s.refused[i][1]]++
	}
	var demand []migplan.Demand
	for i, p := range profiles {
		demand = append(demand, migplan.Demand{Model: "H100", Profile: p, Count: count[i]})
	}
	var gpus []migplan.GPU
	for n := range s.nodes {
		for gi := range s.nodes[n].GPUs {
			g := &s.nodes[n].GPUs[gi]
			mg := migplan.GPU{UUID: g.UUID, Model: g.Model, Idle: true, Frozen: g.PartitionPending, Free: map[string]int{}}
			for _, in := range g.MIG {
				mg.Layout = append(mg.Layout, in.Profile)
				if in.Booked {
					mg.Idle = false
				} else {
					mg.Free[in.Profile]++
				}
			}
			gpus = append(gpus, mg)
		}
	}
	for _, m := range migplan.Propose(migplan.Params{GPUs: gpus, Demand: demand, MaxMoves: s.cfg.MaxMoves}) {
		at := s.byUUID[m.UUID]
		g := &s.nodes[at[0]].GPUs[at[1]]
		g.PartitionPending = true
		s.dirty[at[0]] = true
		s.changes = append(s.changes, change{node: at[0], gpu: at[1], at: now + s.cfg.Delay, layout: m.To})
		s.res.Repartitions++
	}
}
