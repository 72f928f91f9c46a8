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
		for _, r := range live {
			r.result, r.err = b.g.applyHello(ctx, tx, r.p)
			if r.err != nil && !isRefusal(r.err) {
				return r.err
			}
		}
		return nil
	})
	if err != nil && len(live) > 1 {
		for _, r := range live {
			r.err = b.g.cfg.DB.Write(r.ctx, func(ctx context.Context, tx store.Tx) error {
				var err error
				r.result, err = b.g.applyHello(ctx, tx, r.p)
				return err
			})
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

func isRefusal(err error) bool { return errors.Is(err, errRetired) }

// applyHello records one opening in tx: the node's agent facts, this
// replica as session owner, liveness ready; events for a node coming back
// or adopted; and a notification that ends an older session elsewhere.
func (g *Gateway) applyHello(ctx context.Context, tx store.Tx, p fleet.NodeHelloParams) (fleet.NodeStatus, error) {
	before, err := fleet.NodeStatusGet(ctx, tx, p.NodeID)
	if err != nil {
		return before, err
	}
	if before.State == "retired" {
		return before, errRetired
	}
	if before, err = fleet.NodeRecordHello(ctx, tx, &p); err != nil {
		return before, err
	}
	if h := g.cfg.Hooks; h != nil && capabilitiesChanged(before.Capabilities, p.Capabilities) {
		if err := h.NodeCapabilitiesChanged(ctx, tx, p.NodeID); err != nil {
			return before, err
		}
	}
	ref := []fleet.NodeRef{{ID: p.NodeID, TenantID: before.TenantID}}
	if before.Liveness != "ready" || before.State == "joining" {
		if err := g.stateChanged(ctx, tx, ref); err != nil {
			return before, err
		}
	}
	if before.Liveness != "ready" {
		if err := g.nodeEvents(ctx, tx, "node.ready", ref, map[string]any{"was": before.Liveness}); err != nil {
			return before, err
		}
	}
	if before.State == "joining" {
		if err := g.nodeEvents(ctx, tx, "node.active", ref, nil); err != nil {
			return before, err
		}
	}
	return before, fleet.CommandNotify(ctx, tx, p.NodeID)
}
