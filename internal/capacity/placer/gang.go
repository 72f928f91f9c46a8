package placer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/placement"
)

// MaxGangNodes is the most nodes one gang spans.
const MaxGangNodes = 512

// Topologies are the network domains a gang can be kept within, each read
// from the node label TopologyLabel(name).
var Topologies = []string{"rack", "spine", "ib", "nvlink"}

// TopologyLabel is the node label naming a node's domain of a topology.
func TopologyLabel(topology string) string { return "topology." + topology }

// GangPlan is where a gang would go: one plan per member, each on its own
// node, all in Domain. Why says, when Plans is empty, why no domain holds
// the gang; Explanation is placement's account of the pool's nodes.
type GangPlan struct {
	Plans       []placement.Plan
	Nodes       map[string]*placement.Node
	Domain      string
	Why         string
	Explanation placement.Explanation
}

// PlanGang finds room for n members like r on n different nodes sharing
// one value of the topology's label ("" takes any nodes of the pool). Of
// the domains that hold the gang it takes the one with the fewest nodes
// free for a member (ties by name): best fit keeps the roomier domains for
// bigger gangs. It books nothing.
//
// It first tries the domains the candidate buckets say have room (nodes
// with enough GPUs free as of their last change), fewest such nodes first,
// each with a snapshot of that domain's nodes only; the first that holds
// the gang is taken. Only when none does — the buckets count free GPUs
// now, so a later window can fit where they say no — does it scan the
// whole pool, which also explains a gang that does not fit.
func PlanGang(ix *Index, r *capmodel.Reservation, n int, topology string) (GangPlan, error) {
	req := Request(r)
	key := ""
	if topology != "" {
		key = TopologyLabel(topology)
	}
	byDomain := ix.domains(key, ShapeOf(r.MIGProfile, r.Slots), r.GPUs+r.Slots)
	names := make([]string, 0, len(byDomain))
	for d, ns := range byDomain {
		if len(ns) >= n {
			names = append(names, d)
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(len(byDomain[a]), len(byDomain[b])), strings.Compare(a, b))
	})
	for _, d := range names {
		snap := ix.snapshotNodes(byDomain[d], r.StartsAt, r.EndsAt)
		res, err := placement.Place(snap.Snap, req, placement.Options{Limit: n})
		if err != nil {
			return GangPlan{}, err
		}
		if len(res.Plans) == n {
			return GangPlan{Plans: res.Plans, Nodes: snap.Nodes, Domain: d, Explanation: res.Explanation}, nil
		}
	}
	return planGangScan(ix, r, req, n, topology, key)
}

// planGangScan is PlanGang over every node of the pool with room for a
// member in r's window: exact, best fit by the nodes each domain has free
// for a member, and the source of the explanation when nothing fits.
func planGangScan(ix *Index, r *capmodel.Reservation, req placement.Request, n int, topology, key string) (GangPlan, error) {
	// Only nodes with room for one member can take part.
	snap := ix.Snapshot(r.StartsAt, r.EndsAt, "", 0, 0, nil)
	domains := map[string][]placement.Node{}
	unlabelled := 0
	for _, node := range snap.Nodes {
		d, ok := "", true
		if key != "" {
			d, ok = node.Labels[key]
		}
		if !ok || (key != "" && d == "") {
			unlabelled++
			continue
		}
		domains[d] = append(domains[d], *node)
	}
	names := make([]string, 0, len(domains))
	for d := range domains {
		names = append(names, d)
	}
	slices.Sort(names)
	best := GangPlan{Nodes: snap.Nodes}
	bestFree, largest, largestName := math.MaxInt, 0, ""
	for _, d := range names {
		nodes := domains[d]
		slices.SortFunc(nodes, func(a, b placement.Node) int { return strings.Compare(a.ID, b.ID) })
		res, err := placement.Place(placement.NewSnapshot(nodes), req, placement.Options{Limit: n})
		if err != nil {
			return GangPlan{}, err
		}
		free := res.Explanation.Feasible
		if free > largest {
			largest, largestName = free, d
		}
		if free >= n && free < bestFree && len(res.Plans) == n {
			bestFree = free
			best.Plans, best.Domain = res.Plans, d
		}
	}
	if best.Plans != nil {
		return best, nil
	}
	// No domain holds it: the whole pool's account of its nodes, and the
	// sentence the caller reads.
	res, err := placement.Place(snap.Snap, req, placement.Options{Limit: 1})
	if err != nil {
		return GangPlan{}, err
	}
	best.Explanation = res.Explanation
	switch {
	case key == "":
		best.Why = fmt.Sprintf("%d nodes asked, %d can hold a member now", n, largest)
	case len(names) == 0:
		best.Why = fmt.Sprintf("%d nodes asked, and no node of the pool carries the label %s", n, key)
	default:
		best.Why = fmt.Sprintf("%d nodes asked, the largest %s (%s) has %d that can hold a member now", n, topology, largestName, largest)
		if unlabelled > 0 {
			best.Why += fmt.Sprintf("; %d nodes of the pool carry no %s label", unlabelled, key)
		}
	}
	return best, nil
}

// PlaceGang places a gang's members (identical but for their ids) on
// len(rs) different nodes within one domain of topology and books them in
// the batch: all or none. A plan the database refuses (the per-item
// fallback, written at once) makes it read the contested nodes again and
// plan the whole gang anew, up to MaxReplans times. It returns the domain,
// or "" and why nothing was booked.
func (e *Placers) PlaceGang(ctx context.Context, b *Batch, rs []*capmodel.Reservation, topology string, now time.Time) (domain, why string, ex placement.Explanation, err error) {
	if len(rs) == 0 {
		return "", "", ex, errors.New("placer: a gang with no members")
	}
	ix := b.ix
	for attempt := 0; attempt < MaxReplans; attempt++ {
		g, err := PlanGang(ix, rs[0], len(rs), topology)
		if err != nil {
			return "", "", ex, err
		}
		if g.Plans == nil {
			return "", g.Why, g.Explanation, nil
		}
		// Kept for the answer should the replans run out.
		ex = g.Explanation
		m := b.Mark()
		failed := ""
		bookAll := func() error {
			for i, r := range rs {
				plan := &g.Plans[i]
				if err := e.book(ctx, b, r, plan, g.Nodes[plan.NodeID]); err != nil {
					failed = plan.NodeID
					return err
				}
			}
			return nil
		}
		if b.immediate {
			// Written at once: one savepoint for the whole gang, so a
			// member the database refuses takes the others' rows with it.
			err = Savepoint(ctx, b.tx, "gang", bookAll)
		} else {
			err = bookAll()
		}
		if err != nil {
			// Nothing of a gang that did not land whole stays booked.
			b.Rewind(m)
		}
		var contested []string
		switch {
		case err == nil:
			return g.Domain, "", g.Explanation, nil
		case errors.Is(err, errNodeGone):
			ix.markUnschedulable(failed)
			b.gone = append(b.gone, failed)
		case errors.Is(err, errStaleIndex):
			// This transaction reads what is committed: read the node
			// again, whole.
			if err := ix.reread(ctx, b.tx, []string{failed}, now); err != nil {
				return "", "", ex, err
			}
			contested = append(contested, failed)
		case errors.Is(err, booking.ErrOverlap), errors.Is(err, errHostFull):
			contested = append(contested, failed)
		default:
			return "", "", ex, err
		}
		if len(contested) > 0 {
			e.replans.Add(1)
			if err := ix.sync(ctx, b.tx, contested, now); err != nil {
				return "", "", ex, err
			}
		}
	}
	return "", fmt.Sprintf("%d nodes asked; the nodes planned for it kept changing under it (%d plans in a row were refused by the database)", len(rs), MaxReplans), ex, nil
}
