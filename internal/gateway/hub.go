package gateway

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// hub maps node ids to this replica's sessions: one session per node, and
// the way a command write wakes the session that delivers it.
type hub struct {
	mu       sync.Mutex
	sessions map[string]*session
	closed   error
}

func newHub() *hub { return &hub{sessions: map[string]*session{}} }

// register makes s the node's session and ends the one it replaces. It
// fails with the shutdown cause once the hub is closed.
func (h *hub) register(s *session) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed != nil {
		return h.closed
	}
	if old := h.sessions[s.nodeID]; old != nil {
		old.cancel(errReplaced)
	}
	h.sessions[s.nodeID] = s
	return nil
}

// unregister removes s if it is still the node's session and reports
// whether it was.
func (h *hub) unregister(s *session) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sessions[s.nodeID] != s {
		return false
	}
	delete(h.sessions, s.nodeID)
	return true
}

func (h *hub) get(nodeID string) *session {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sessions[nodeID]
}

func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sessions)
}

func (h *hub) wake(nodeID string) {
	if s := h.get(nodeID); s != nil {
		s.poke()
	}
}

func (h *hub) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.sessions {
		s.poke()
	}
}

// closeAll ends every session with cause and refuses new ones.
func (h *hub) closeAll(cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = cause
	for _, s := range h.sessions {
		s.cancel(cause)
	}
}

// batcher collects heartbeats between flushes, so that 10,000 sessions
// beating every 10 s cost one write transaction a second, not a thousand.
type batcher struct {
	mu      sync.Mutex
	pending map[string]struct{}
}

func newBatcher() *batcher { return &batcher{pending: map[string]struct{}{}} }

func (b *batcher) add(nodeID string) {
	b.mu.Lock()
	b.pending[nodeID] = struct{}{}
	b.mu.Unlock()
}

// take returns the pending node ids, sorted so that replicas flushing
// overlapping batches lock rows in one order.
func (b *batcher) take() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.pending) == 0 {
		return nil
	}
	ids := make([]string, 0, len(b.pending))
	for id := range b.pending {
		ids = append(ids, id)
	}
	b.pending = map[string]struct{}{}
	sort.Strings(ids)
	return ids
}

func (g *Gateway) runHeartbeats(ctx context.Context) {
	t := time.NewTicker(g.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if err := g.FlushHeartbeats(fctx); err != nil {
				g.log.Error("flush heartbeats at stop", "err", err)
			}
			cancel()
			return
		case <-t.C:
			if err := g.FlushHeartbeats(ctx); err != nil && ctx.Err() == nil {
				g.log.Error("flush heartbeats", "err", err)
			}
		}
	}
}

// FlushHeartbeats writes the heartbeats received since the last flush in one
// transaction, and marks nodes that were unreachable or lost ready again
// (event node.ready). On failure the heartbeats are kept for the next flush.
func (g *Gateway) FlushHeartbeats(ctx context.Context) error {
	ids := g.beats.take()
	if len(ids) == 0 {
		return nil
	}
	err := g.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		revived, err := fleet.NodeRecordHeartbeats(ctx, tx, ids)
		if err != nil {
			return err
		}
		if err := g.stateChanged(ctx, tx, revived); err != nil {
			return err
		}
		return g.nodeEvents(ctx, tx, "node.ready", revived, nil)
	})
	if err != nil {
		for _, id := range ids {
			g.beats.add(id)
		}
		return err
	}
	return nil
}

// stateChanged tells the hooks of nodes that started or stopped taking
// work.
func (g *Gateway) stateChanged(ctx context.Context, tx store.Tx, nodes []fleet.NodeRef) error {
	h := g.cfg.Hooks
	if h == nil || len(nodes) == 0 {
		return nil
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID
	}
	return h.NodesStateChanged(ctx, tx, ids)
}

// nodeEvents records one event of type typ per node.
func (g *Gateway) nodeEvents(ctx context.Context, tx store.Tx, typ string, nodes []fleet.NodeRef, data map[string]any) error {
	if len(nodes) == 0 {
		return nil
	}
	now := g.cfg.Clock.Now()
	evs := make([]envelope.Event, 0, len(nodes))
	for _, n := range nodes {
		evs = append(evs, envelope.Event{Type: typ, TenantID: n.TenantID, ResourceType: "Node", ResourceID: n.ID, Time: now, Data: data})
	}
	return g.cfg.Recorder.InsertEvents(ctx, tx, evs)
}

// runListener keeps a PostgreSQL connection LISTENing on the command
// channel and wakes the named node's session on each notification. After
// a reconnect it wakes every session, since notifications sent meanwhile
// are lost.
func (g *Gateway) runListener(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := g.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		g.log.Warn("command listener lost its connection; retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

func (g *Gateway) listenOnce(ctx context.Context) error {
	pc, err := g.cfg.DB.PgxPool().Acquire(ctx)
	if err != nil {
		return err
	}
	// A LISTENing connection must never go back to the pool.
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	if err := fleet.CommandListen(ctx, conn); err != nil {
		return err
	}
	g.hub.wakeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		g.hub.wake(n.Payload)
	}
}
