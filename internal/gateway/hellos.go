package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// helloBatch group-commits session openings. After a gateway restart every
// node says Hello within seconds; one write transaction each would queue
// ten thousand transactions behind SQLite's single writer. Openings that
// arrive together share one transaction instead; each still gets its own
// answer.
type helloBatch struct {
	g    *Gateway
	reqs chan *helloReq
}

type helloReq struct {
	ctx    context.Context
	p      fleet.NodeHelloParams
	result fleet.NodeStatus
	err    error
	done   chan struct{}
}

const (
	helloBatchMax  = 256
	helloBatchWait = 2 * time.Millisecond
)

func newHelloBatch(g *Gateway) *helloBatch {
	return &helloBatch{g: g, reqs: make(chan *helloReq, helloBatchMax)}
}

// submit records a node's session opening and returns its row as it was
// before (or the error that refused it).
func (b *helloBatch) submit(ctx context.Context, p fleet.NodeHelloParams) (fleet.NodeStatus, error) {
	r := &helloReq{ctx: ctx, p: p, done: make(chan struct{})}
	select {
	case b.reqs <- r:
	case <-ctx.Done():
		return fleet.NodeStatus{}, ctx.Err()
	}
	select {
	case <-r.done:
		return r.result, r.err
	case <-ctx.Done():
		return fleet.NodeStatus{}, ctx.Err()
	}
}

// run commits batches until ctx ends.
func (b *helloBatch) run(ctx context.Context) {
	for {
		var batch []*helloReq
		select {
		case <-ctx.Done():
			return
		case r := <-b.reqs:
			batch = append(batch, r)
		}
		timer := time.NewTimer(helloBatchWait)
	gather:
		for len(batch) < helloBatchMax {
			select {
			case r := <-b.reqs:
				batch = append(batch, r)
			case <-timer.C:
				break gather
			}
		}
		timer.Stop()
		b.commit(ctx, batch)
	}
}

// commit applies a batch in one transaction; if that transaction fails as a
// whole, each opening is retried alone so one bad row cannot refuse the
// others.
func (b *helloBatch) commit(ctx context.Context, batch []*helloReq) {
	live := batch[:0:0]
	for _, r := range batch {
		if r.ctx.Err() != nil {
			r.err = r.ctx.Err()
			close(r.done)
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	err := b.g.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return b.g.applyHellos(ctx, tx, live)
	})
	if err != nil && len(live) > 1 {
		for _, r := range live {
			err := b.g.cfg.DB.Write(r.ctx, func(ctx context.Context, tx store.Tx) error {
				return b.g.applyHellos(ctx, tx, []*helloReq{r})
			})
			if err != nil {
				r.err = err
			}
		}
	} else if err != nil {
		live[0].err = err
	}
	for _, r := range live {
		close(r.done)
	}
}

// capabilitiesChanged compares the stored capabilities (a JSON array) with
// the ones a Hello advertises, as sets.
func capabilitiesChanged(stored string, now []string) bool {
	var old []string
	if stored != "" && json.Unmarshal([]byte(stored), &old) != nil {
		return true
	}
	a, b := slices.Clone(old), slices.Clone(now)
	slices.Sort(a)
	slices.Sort(b)
	return !slices.Equal(slices.Compact(a), slices.Compact(b))
}

// errRetired refuses a session of a retired node without aborting the
// batch it rode in.
var errRetired = errors.New("node is retired")

// applyHellos records openings in tx: each node's agent facts, this
// replica as session owner, liveness ready; for the batch at once, the
// hooks of nodes that came back or were adopted and their events; and a
// notification per node that ends an older session elsewhere. A refused
// opening (a retired node) sets its request's err and writes nothing; any
// other error fails the whole transaction.
//
// The hooks and events are written once per batch rather than once per
// opening: after a restart that outlasted UnreachableAfter every node
// comes back from unreachable, and one statement each made the batch that
// many statements longer, all under the single SQLite writer.
func (g *Gateway) applyHellos(ctx context.Context, tx store.Tx, reqs []*helloReq) error {
	var (
		changed []fleet.NodeRef
		active  []fleet.NodeRef
		// ready groups the nodes back by the liveness they had, which
		// their node.ready event names.
		ready = map[string][]fleet.NodeRef{}
		was   []string
	)
	for _, r := range reqs {
		before, err := fleet.NodeRecordHello(ctx, tx, &r.p)
		r.result, r.err = before, err
		if err != nil {
			return err
		}
		if before.State == "retired" {
			r.err = errRetired
			continue
		}
		if h := g.cfg.Hooks; h != nil && capabilitiesChanged(before.Capabilities, r.p.Capabilities) {
			if err := h.NodeCapabilitiesChanged(ctx, tx, r.p.NodeID); err != nil {
				return err
			}
		}
		ref := fleet.NodeRef{ID: r.p.NodeID, TenantID: before.TenantID}
		if before.Liveness != "ready" || before.State == "joining" {
			changed = append(changed, ref)
		}
		if before.Liveness != "ready" {
			if _, ok := ready[before.Liveness]; !ok {
				was = append(was, before.Liveness)
			}
			ready[before.Liveness] = append(ready[before.Liveness], ref)
		}
		if before.State == "joining" {
			active = append(active, ref)
		}
		if err := fleet.CommandNotify(ctx, tx, r.p.NodeID); err != nil {
			return err
		}
	}
	if err := g.stateChanged(ctx, tx, changed); err != nil {
		return err
	}
	for _, w := range was {
		if err := g.nodeEvents(ctx, tx, "node.ready", ready[w], map[string]any{"was": w}); err != nil {
			return err
		}
	}
	return g.nodeEvents(ctx, tx, "node.active", active, nil)
}
