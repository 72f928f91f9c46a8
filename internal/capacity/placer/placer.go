package placer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/budget"
	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// The placer is the one owner of a pool's index (the Nomad plan-applier
// pattern). Handlers authenticate, validate and decide per request, then
// submit the mutation to the pool's placer; it takes what is queued (up to
// MaxBatch), places each against its index, writes them all in one
// transaction with multi-row inserts, and only then answers the callers.
// Nothing else places in the pool, so no placement races another and none
// is replanned; the database constraint stays the backstop.
//
// A batch's placements mark the index as they are made, so the next item of
// the batch sees them; the marks are undone if the batch rolls back. When
// the batch fails (a constraint, a lost node, any database error) every item
// is run again, each under its own savepoint, so one item's failure fails
// only that item.

// MaxBatch bounds how many mutations one placer transaction commits.
const MaxBatch = 256

// work is one submitted mutation.
type work struct {
	ctx context.Context
	// run does the mutation in the batch. A staged item only reads and
	// stages rows until it cannot fail; a direct one writes as it goes
	// and runs under a savepoint.
	run    func(ctx context.Context, b *Batch) error
	direct bool
	env    func(ctx context.Context, eb *envelope.Batch) error
	// tenant whose quotas the item may charge: a batch locks them all
	// first, in id order.
	tenant string
	done   chan error
	err    error
	// failed: the item failed on its own (an API error before any write);
	// it is answered with err whatever the batch does.
	failed bool
	// refresh asks the placer only to catch its index up to the pool's
	// version, between batches (a preview that found it behind).
	refresh bool
}

// placer owns one pool's index and commits its batches.
type placer struct {
	e      *Placers
	poolID string
	in     chan *work
	// hold is a moving average of the batches' hold, BEGIN to COMMIT, in
	// nanoseconds: the most a short batch lingers.
	hold atomic.Int64
	// ixMu guards loading ix; the index's own lock guards its contents.
	ixMu sync.Mutex
	ix   *Index
	// cur is the index as last loaded, for readers that must not wait for
	// a load or change it (previews, releases after commit).
	cur atomic.Pointer[Index]
	// deltas are the nodes the atoms reconciler changed, by the pool
	// version each change took.
	deltaMu sync.Mutex
	deltas  map[int64][]string
	// recheck are nodes a batch found no longer taking bookings: the
	// next batch reads them again rather than keeping them out.
	recheck []string
	// retired: another replica took the pool; the loop ends.
	retired bool
	// epoch is the owner row's epoch this placer claimed the pool at
	// (PostgreSQL); every batch checks it still holds.
	epoch int64
	// quit is closed when the placer retires or the placers stop; stop
	// closes it once.
	quit chan struct{}
	stop sync.Once
	// exited is closed when the loop has returned: work still queued then
	// is never run, and its submitter answers itself.
	exited chan struct{}
}

// Batch is one placer transaction.
type Batch struct {
	tx  store.Tx
	env *envelope.Batch
	ix  *Index
	now time.Time
	// immediate: rows are written as staged (the per-item fallback and
	// callers outside a placer).
	immediate bool

	pool      *pool.Pool
	pending   int // pending reservations of the pool, counted once a batch
	pendingOK bool
	nodes     map[string]error // node checks made this batch
	// unchecked are nodes a staged batch booked whose check waits for
	// the flush (verify): one statement for all of them.
	unchecked []string
	quotas    map[quotaKey][]quota.Quota
	// lockedTenants are the tenants whose quota rows the batch holds
	// (FOR UPDATE): those of the items that named theirs, and those a
	// charge of an item that did not (the pending pass) locked since.
	lockedTenants map[string]bool
	itemLocked    []string
	charges       []quota.Charge // charges staged this batch, for later items' quota checks
	// budgets are the locked tenants' budgets, read with their lock (nil:
	// the tenant has none); costs the priced charges staged this batch, for
	// later items' budget checks; prices the pools' prices read so far.
	budgets map[string]*budget.Budget
	costs   []budget.Cost
	prices  budget.PriceBook
	// emit takes the events of a batch without an envelope (Immediate
	// inside a mutation: the mutation's own transaction writes them).
	emit func(envelope.Event)
	// rows staged by the caller's store code (a new reservation),
	// written by INSERT head, in order.
	rows     []stagedRow
	bookings []booking.Booking
	cpus     []booking.CPURange
	rollups  map[rollupDelta]int
	// atoms this batch booked: checked in the pool and usable at once
	// before the commit.
	atoms []string
	// hosts are the host shares this batch staged but has not written,
	// which the database cannot count yet.
	hosts []hostShare
	// gone are nodes the batch found no longer taking bookings: the
	// placer reads them again before its next batch.
	gone       []string
	undo       []func()
	afterwards []func()
	shared     sharedSnap
}

// stagedRow is one row for an INSERT whose head (table and columns) the
// staging package's store code supplies.
type stagedRow struct {
	head string
	row  []any
}

type rollupDelta struct{ pool, model, kind string }

type quotaKey struct{ tenant, project, pool, model string }

func newBatch(tx store.Tx, ix *Index, now time.Time) *Batch {
	return &Batch{tx: tx, ix: ix, now: now, nodes: map[string]error{}, quotas: map[quotaKey][]quota.Quota{},
		rollups: map[rollupDelta]int{}, lockedTenants: map[string]bool{}, budgets: map[string]*budget.Budget{}}
}

// Immediate is a batch for one change outside a placer (a reservation with
// no pool): it writes as it goes and books against no index, so its checks
// — quota above all — are the placer's, not a second copy of them.
func Immediate(tx store.Tx, now time.Time) *Batch {
	b := newBatch(tx, nil, now)
	b.immediate = true
	return b
}

// Mark is where a batch stood before an item, to undo the item alone.
type Mark struct {
	env                           envelope.BatchMark
	rows, bookings, undo, charges int
	costs                         int
	atoms, cpus, hosts, locked    int
	pending, unchecked            int
	rollups                       map[rollupDelta]int
}

// Mark notes where the batch stands before an item.
func (b *Batch) Mark() Mark {
	m := Mark{rows: len(b.rows), bookings: len(b.bookings), undo: len(b.undo), charges: len(b.charges), costs: len(b.costs), pending: b.pending, atoms: len(b.atoms), cpus: len(b.cpus),
		hosts: len(b.hosts), locked: len(b.itemLocked), unchecked: len(b.unchecked)}
	if b.env != nil {
		m.env = b.env.Mark()
	}
	if len(b.rollups) > 0 {
		m.rollups = make(map[rollupDelta]int, len(b.rollups))
		for k, v := range b.rollups {
			m.rollups[k] = v
		}
	}
	return m
}

// Rewind drops what an item staged and undoes its index marks.
func (b *Batch) Rewind(m Mark) {
	for i := len(b.undo) - 1; i >= m.undo; i-- {
		b.undo[i]()
	}
	b.undo = b.undo[:m.undo]
	b.rows, b.bookings, b.charges, b.pending = b.rows[:m.rows], b.bookings[:m.bookings], b.charges[:m.charges], m.pending
	b.atoms, b.cpus, b.hosts = b.atoms[:m.atoms], b.cpus[:m.cpus], b.hosts[:m.hosts]
	// The item's locks go with its savepoint, and the budgets read
	// under them with the locks.
	for _, t := range b.itemLocked[m.locked:] {
		delete(b.budgets, t)
	}
	b.itemLocked = b.itemLocked[:m.locked]
	b.costs = b.costs[:m.costs]
	// A node the item left unchecked is checked again by the next that
	// books it.
	for _, id := range b.unchecked[m.unchecked:] {
		delete(b.nodes, id)
	}
	b.unchecked = b.unchecked[:m.unchecked]
	if b.env != nil {
		b.env.Rewind(m.env)
	}
	clear(b.rollups)
	for k, v := range m.rollups {
		b.rollups[k] = v
	}
}

// undoAll undoes every index mark of a batch that rolled back.
func (b *Batch) undoAll() {
	for i := len(b.undo) - 1; i >= 0; i-- {
		b.undo[i]()
	}
	b.undo = nil
}

// Atomic runs fn so that when it fails nothing of it stays written: under
// a savepoint where the batch writes as it goes (the per-item fallback, a
// direct item), as it is otherwise (the caller's Rewind drops what it
// staged). A part of an item that may fail alone (an array's member) runs
// in one.
func (b *Batch) Atomic(ctx context.Context, name string, fn func() error) error {
	if b == nil || !b.immediate {
		return fn()
	}
	return Savepoint(ctx, b.tx, name, fn)
}

// Stage queues one row for INSERT head ("INSERT INTO t (cols)"): written at
// once outside a batch, with the batch's other rows of that head otherwise.
func (b *Batch) Stage(ctx context.Context, head string, row []any) error {
	if b.immediate {
		return store.InsertRows(ctx, b.tx, head, "", [][]any{row})
	}
	b.rows = append(b.rows, stagedRow{head, row})
	return nil
}

// stageBookings queues bookings of devices and CPU ranges.
func (b *Batch) stageBookings(ctx context.Context, bs []booking.Booking, cpus []booking.CPURange) error {
	if b.immediate {
		return booking.Insert(ctx, b.tx, bs, cpus)
	}
	b.bookings = append(b.bookings, bs...)
	b.cpus = append(b.cpus, cpus...)
	return nil
}

// StageRollup adds to a capacity rollup's booked count.
func (b *Batch) StageRollup(ctx context.Context, poolID, model, kind string, n int) error {
	if b.immediate {
		return atoms.RollupAdd(ctx, b.tx, poolID, model, kind, 0, n, 0)
	}
	b.rollups[rollupDelta{poolID, model, kind}] += n
	return nil
}

// verify checks, against the database, what the batch booked from its
// index since it last verified: every atom still in the pool and usable (a
// GPU quarantined, a node moved out since the index learned of it), every
// host share within its node's memory and hugepages and single tenancy. A
// staged batch verifies once, when it flushes (a miss fails the batch, and
// the per-item fallback finds the item); a batch that writes as it goes
// verifies each plan it books, so the database's refusal reaches the
// replan loop. The checks are the same either way.
func (b *Batch) verify(ctx context.Context) error {
	if len(b.unchecked) > 0 {
		if err := b.checkNodes(ctx); err != nil {
			return err
		}
	}
	if len(b.hosts) > 0 {
		if ok, err := b.hostsUsable(ctx); err != nil || !ok {
			return errors.Join(err, errHostFull, errStaleIndex)
		}
		// Written by now or at this flush: the database counts them
		// from here on.
		b.hosts = b.hosts[:0]
	}
	if len(b.atoms) > 0 && b.ix != nil {
		if ok, err := atomsUsable(ctx, b.tx, b.ix.poolID, "", b.atoms); err != nil || !ok {
			return errors.Join(err, errStaleIndex)
		}
		b.atoms = b.atoms[:0]
	}
	return nil
}

// flush verifies and writes what the batch staged.
func (b *Batch) flush(ctx context.Context) error {
	if err := b.verify(ctx); err != nil {
		return err
	}
	if err := insertStaged(ctx, b.tx, b.rows); err != nil {
		return err
	}
	b.rows = b.rows[:0]
	if err := booking.Insert(ctx, b.tx, b.bookings, b.cpus); err != nil {
		return err
	}
	b.bookings, b.cpus = b.bookings[:0], b.cpus[:0]
	for k, n := range b.rollups {
		if n != 0 {
			if err := atoms.RollupAdd(ctx, b.tx, k.pool, k.model, k.kind, 0, n, 0); err != nil {
				return err
			}
		}
	}
	clear(b.rollups)
	// Written now, the staged charges are what usage queries count.
	b.charges = b.charges[:0]
	b.costs = b.costs[:0]
	if b.env != nil {
		return b.env.Flush(ctx)
	}
	return nil
}

// hostShare is one reservation's claim on its node's host, staged in a
// batch.
type hostShare struct {
	node, rsv, tenant string
	start, end        time.Time
	mem, hp1, atoms   int
	single            bool
}

// checked says whether the share asks for what the batch checks in the
// database before it commits.
func (h hostShare) checked() bool { return h.mem > 0 || h.hp1 > 0 || h.single }

// hostsUsable checks, once a batch, every staged share that asks for host
// memory, hugepages or single tenancy against the database (host rows
// locked) and the batch's other shares: the batch trusts its index only
// as far as the database agrees.
func (b *Batch) hostsUsable(ctx context.Context) (bool, error) {
	var nodes, hostNodes []string
	var from, to time.Time
	for _, h := range b.hosts {
		if !h.checked() {
			continue
		}
		nodes = append(nodes, h.node)
		if h.mem > 0 || h.hp1 > 0 {
			hostNodes = append(hostNodes, h.node)
		}
		if from.IsZero() || h.start.Before(from) {
			from = h.start
		}
		if h.end.After(to) {
			to = h.end
		}
	}
	if len(nodes) == 0 {
		return true, nil
	}
	caps, err := hostCaps(ctx, b.tx, hostNodes)
	if err != nil {
		return false, err
	}
	held, err := hostHolds(ctx, b.tx, nodes, from, to)
	if err != nil {
		return false, err
	}
	staged := make(map[string]bool, len(b.hosts))
	for _, h := range b.hosts {
		staged[h.rsv] = true
	}
	for _, h := range b.hosts {
		if !h.checked() {
			continue
		}
		mem, hp1, others := h.mem, h.hp1, 0
		add := func(o hostShare) {
			if o.node != h.node || o.rsv == h.rsv || !o.start.Before(h.end) || !o.end.After(h.start) {
				return
			}
			mem += o.mem
			hp1 += o.hp1
			if o.tenant != h.tenant && o.atoms > 0 {
				others++
			}
		}
		for _, o := range held {
			if !staged[o.rsv] {
				add(o)
			}
		}
		for _, o := range b.hosts {
			add(o)
		}
		c, ok := caps[h.node]
		if (h.mem > 0 || h.hp1 > 0) && (!ok || mem > c[0] || hp1 > c[1]) {
			return false, nil
		}
		if h.single && others > 0 {
			return false, nil
		}
	}
	return true, nil
}

// ExtendHost notes the host share of a reservation extended to its new end
// (r.EndsAt), checked as a booking's is: against the database's other
// shares on its node, host row locked, at once in a batch that writes as
// it goes and at the flush otherwise. An extension has no new devices to
// collide on, so without it nothing would keep a longer window from
// over-committing the host's memory, hugepages or single tenancy with a
// reservation that starts later on the node. The refusal matches
// IsHostFull.
func (b *Batch) ExtendHost(ctx context.Context, r *capmodel.Reservation) error {
	h := shareOf(r, r.NodeID, r.GPUs+r.Slots)
	if !h.checked() || r.NodeID == "" {
		return nil
	}
	b.hosts = append(b.hosts, h)
	if b.immediate {
		return b.verify(ctx)
	}
	return nil
}

// IsHostFull says whether err is a host share refused for want of memory,
// hugepages or single tenancy.
func IsHostFull(err error) bool { return errors.Is(err, errHostFull) }

// noteHost records a booking's host share, for verify.
func (b *Batch) noteHost(r *capmodel.Reservation, nodeID string, atoms int) {
	b.hosts = append(b.hosts, shareOf(r, nodeID, atoms))
}

// shareOf is r's claim on nodeID's host over its window.
func shareOf(r *capmodel.Reservation, nodeID string, atoms int) hostShare {
	return hostShare{node: nodeID, rsv: r.ID, tenant: r.TenantID, start: r.StartsAt, end: r.EndsAt,
		mem: r.MemoryGiB, hp1: r.Hugepages1Gi, atoms: atoms, single: r.SingleTenant}
}

// checkNode verifies, once a batch, that a node may take bookings: active,
// ready, and locked against a concurrent liveness sweep (FOR SHARE).
func (b *Batch) checkNode(ctx context.Context, nodeID string) error {
	if err, ok := b.nodes[nodeID]; ok {
		return err
	}
	if !b.immediate {
		// Staged: checked (and on PostgreSQL share-locked) with the
		// batch's other nodes at the flush, in one statement — one round
		// trip a batch instead of one a node (an array of a hundred
		// reservations books a dozen nodes). A node gone by then fails
		// the batch, and its items run again one by one, checked here.
		b.nodes[nodeID] = nil
		b.unchecked = append(b.unchecked, nodeID)
		return nil
	}
	state, liveness, err := fleet.NodeStateForShare(ctx, b.tx, nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		err = errNodeGone
	case err == nil && (state != "active" || liveness != "ready"):
		err = errNodeGone
	}
	if err == nil || errors.Is(err, errNodeGone) {
		b.nodes[nodeID] = err
	}
	return err
}

// checkNodes checks the nodes staged bookings wait on, in one statement.
// A node no longer taking bookings leaves the index's placements, and the
// batch fails with errNodeGone (its items run again, one by one).
func (b *Batch) checkNodes(ctx context.Context) error {
	ids := slices.Clone(b.unchecked)
	slices.Sort(ids)
	states, err := fleet.NodeStatesForShare(ctx, b.tx, ids)
	if err != nil {
		return err
	}
	b.unchecked = b.unchecked[:0]
	var gone []string
	for _, id := range ids {
		if st, ok := states[id]; !ok || st.State != "active" || st.Liveness != "ready" {
			gone = append(gone, id)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	for _, id := range gone {
		b.nodes[id] = errNodeGone
		if b.ix != nil {
			b.ix.markUnschedulable(id)
		}
	}
	b.gone = append(b.gone, gone...)
	return fmt.Errorf("%w: %s", errNodeGone, strings.Join(gone, ", "))
}

// LockPool re-reads the pool under a row lock, once a batch: a pool archived
// after the decision books nothing, and batches of one pool from two
// replicas (during a handover) take turns.
func (b *Batch) LockPool(ctx context.Context, poolID string) (*pool.Pool, error) {
	if b.pool != nil {
		return b.pool, nil
	}
	p, err := pool.GetForUpdate(ctx, b.tx, poolID)
	if err != nil {
		return nil, err
	}
	b.pool = &p
	return b.pool, nil
}

// PendingCount counts the pool's pending reservations once a batch; the
// batch adds its own.
func (b *Batch) PendingCount(ctx context.Context, poolID string) (int, error) {
	if !b.pendingOK {
		if err := countPending(ctx, b.tx, poolID).Scan(&b.pending); err != nil {
			return 0, err
		}
		b.pendingOK = true
	}
	return b.pending, nil
}

// LockTenant locks a tenant's quota rows for the rest of the batch unless it
// holds them already: an item that did not name its tenant up front (the
// pending pass places many tenants' work) charges quotas that a create in
// another pool may charge at once, and the two must take turns. Call it
// outside a savepoint: rolling one back lets go of what it locked.
func (b *Batch) LockTenant(ctx context.Context, tenantID string) error {
	if b.lockedTenants[tenantID] || slices.Contains(b.itemLocked, tenantID) {
		return nil
	}
	if err := quota.LockTenants(ctx, b.tx, []string{tenantID}); err != nil {
		return err
	}
	if err := b.lockBudgets(ctx, []string{tenantID}); err != nil {
		return err
	}
	// Rewound with the item: its savepoint's rollback lets go of the lock.
	b.itemLocked = append(b.itemLocked, tenantID)
	return nil
}

// CheckQuota checks a charge against the quotas that cover it, counting the
// charges this batch staged before it, then, priced, against its tenant's
// budget (checkBudget): every booking path checks both in one call. The
// covering quotas are read (and locked, on PostgreSQL) once a batch per key.
func (b *Batch) CheckQuota(ctx context.Context, c quota.Charge) error {
	k := quotaKey{c.TenantID, c.ProjectID, c.PoolID, c.Model}
	qs, ok := b.quotas[k]
	if !ok {
		if err := b.LockTenant(ctx, c.TenantID); err != nil {
			return err
		}
		var err error
		if qs, err = quota.Covering(ctx, b.tx, c); err != nil {
			return err
		}
		b.quotas[k] = qs
	}
	if len(qs) > 0 {
		if _, err := quota.CheckCovered(ctx, b.tx, c, qs, b.charges); err != nil {
			return err
		}
	}
	if err := b.checkBudget(ctx, c); err != nil {
		return err
	}
	if !b.immediate {
		// Staged: counted with the usage until the flush writes it. Written
		// as it goes, the charge's row is in the database before the next
		// check, and counting it here too would count it twice.
		b.charges = append(b.charges, c)
	}
	return nil
}

// placerFor returns the pool's placer when this replica owns the pool.
func (e *Placers) placerFor(ctx context.Context, poolID string) (*placer, error) {
	p, url, err := e.claim(ctx, poolID)
	if err == nil && p == nil {
		err = &envelope.Error{Code: envelope.CodeUnavailable, Message: "pool " + poolID + " is placed by the replica at " + url}
	}
	return p, err
}

// startPlacer starts the pool's placer; the caller holds plMu.
func (e *Placers) startPlacer(poolID string, epoch int64) *placer {
	if e.placers == nil {
		e.placers = map[string]*placer{}
	}
	p := &placer{e: e, poolID: poolID, epoch: epoch, in: make(chan *work, 4*MaxBatch), quit: make(chan struct{}), exited: make(chan struct{}),
		deltas: map[int64][]string{}}
	e.placers[poolID] = p
	go p.loop()
	return p
}

// submit hands a mutation to the pool's placer and waits for its answer.
func (e *Placers) submit(ctx context.Context, poolID string, w *work) (err error) {
	if e.SubmitObserved != nil {
		start := time.Now()
		defer func() { e.SubmitObserved(time.Since(start), err) }()
	}
	w.ctx, w.done = ctx, make(chan error, 1)
	p, err := e.placerFor(ctx, poolID)
	if err != nil {
		return err
	}
	select {
	case p.in <- w:
		e.submitted.Add(1)
	case <-p.quit:
		return notOwner(poolID)
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-w.done:
		return err
	case <-p.exited:
		// The placer retired; it answered w before it returned, or never
		// took it.
		select {
		case err := <-w.done:
			return err
		default:
			return notOwner(poolID)
		}
	case <-ctx.Done():
		// The placer may still commit it; the caller learns nothing more.
		return ctx.Err()
	}
}

// SubmitMutation runs an envelope mutation in the pool's placer (the
// envelope's Mutation.Submit). direct: its Apply writes as it goes.
func (e *Placers) SubmitMutation(ctx context.Context, poolID, tenantID string, direct bool, write func(ctx context.Context, eb *envelope.Batch) error) error {
	return e.submit(ctx, poolID, &work{env: write, direct: direct, tenant: tenantID})
}

// loop takes what is queued and commits it in batches, one at a time:
// while one commits the next fills.
func (p *placer) loop() {
	defer close(p.exited)
	var tick <-chan time.Time
	if p.e.PendingEvery > 0 {
		// Across replicas the queue of a pool is its owner's to run: the
		// leader's tick and wake jobs elsewhere pass it by.
		t := time.NewTicker(p.e.PendingEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		var w *work
		select {
		case w = <-p.in:
		case <-p.quit:
			p.drain()
			return
		case <-tick:
			if p.e.PendingPass != nil {
				go p.e.PendingPass(p.poolID)
			}
			continue
		}
		if w == nil {
			return
		}
		var ws, refreshes []*work
		var linger *time.Timer
		lingered := false
		for w != nil && len(ws) < MaxBatch {
			if w.refresh {
				refreshes = append(refreshes, w)
			} else {
				ws = append(ws, w)
			}
			select {
			case w = <-p.in:
				continue
			default:
				w = nil
			}
			// The queue is empty: a short batch waits a little for more,
			// once, on one timer.
			wait := p.lingerFor(len(ws))
			if wait <= 0 || lingered {
				break
			}
			if linger == nil {
				linger = time.NewTimer(wait)
			}
			select {
			case w = <-p.in:
			case <-linger.C:
				lingered = true
			case <-p.quit:
			}
		}
		if linger != nil {
			linger.Stop()
		}
		if len(ws) > 0 {
			p.commit(ws)
		}
		if len(refreshes) > 0 && !p.retired {
			_, err := p.current(true)
			for _, r := range refreshes {
				r.done <- err
			}
		}
		if p.retired {
			p.drain()
			return
		}
	}
}

// LingerBatch is the batch size at which a placer stops waiting for more.
const LingerBatch = 8

// DefaultLinger is Placers.Linger unless the configuration says otherwise.
const DefaultLinger = 250 * time.Microsecond

// lingerFor is how long a placer holding n mutations waits for more: not
// at all with LingerBatch or more, or no mutation (refreshes only), else
// Linger, or the recent commits' hold when that is shorter.
func (p *placer) lingerFor(n int) time.Duration {
	wait := p.e.Linger
	if wait <= 0 || n == 0 || n >= LingerBatch {
		return 0
	}
	if hold := time.Duration(p.hold.Load()); hold > 0 && hold < wait {
		wait = hold
	}
	return wait
}

// drain answers what is still queued for a retired placer.
func (p *placer) drain() {
	for {
		select {
		case w := <-p.in:
			w.done <- notOwner(p.poolID)
		default:
			return
		}
	}
}

// current returns the index, first checking the pool's version when check
// is set (the placer does before each batch): the atoms reconciler bumps it
// when the pool's nodes or atoms change.
func (p *placer) current(check bool) (*Index, error) {
	p.ixMu.Lock()
	defer p.ixMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if p.ix != nil && !check {
		return p.ix, nil
	}
	var ix *Index
	err := p.e.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		v, err := poolVersion(ctx, tx, p.poolID)
		if err != nil {
			return err
		}
		p.deltaMu.Lock()
		recheck := p.recheck
		p.recheck = nil
		p.deltaMu.Unlock()
		if p.ix != nil && p.ix.version == v && len(recheck) == 0 {
			ix = p.ix
			return nil
		}
		// Deltas cover the change when every version since the index's
		// came with one (another replica's reconcile, or a policy change,
		// bumps without). Nodes a batch found gone are read again too, so
		// none stays out of placement after it comes back.
		covered := p.ix != nil && v >= p.ix.version
		set := map[string]bool{}
		for _, id := range recheck {
			set[id] = true
		}
		p.deltaMu.Lock()
		if covered {
			for ver := p.ix.version + 1; ver <= v; ver++ {
				ns, ok := p.deltas[ver]
				if !ok {
					covered = false
					break
				}
				for _, id := range ns {
					set[id] = true
				}
			}
		}
		for ver := range p.deltas {
			if ver <= v {
				delete(p.deltas, ver)
			}
		}
		p.deltaMu.Unlock()
		nodes := slices.Sorted(maps.Keys(set))
		if covered && len(nodes) == 0 {
			p.ix.setVersion(v)
			ix = p.ix
			return nil
		}
		if covered {
			// Every change since the index was loaded is one this
			// process's reconciler told of: read those nodes again
			// instead of the whole pool.
			if err := p.ix.reread(ctx, tx, nodes, p.e.Clock.Now()); err != nil {
				return err
			}
			p.ix.setVersion(v)
			p.e.deltas.Add(1)
			ix = p.ix
			return nil
		}
		ix, err = loadIndex(ctx, tx, p.poolID, v, p.e.Clock.Now())
		return err
	})
	if err != nil {
		return nil, err
	}
	p.ix = ix
	p.cur.Store(ix)
	return ix, nil
}

// commit runs ws in one transaction and answers each.
func (p *placer) commit(ws []*work) {
	live := ws[:0:0]
	for _, w := range ws {
		if err := w.ctx.Err(); err != nil {
			w.done <- err
			continue
		}
		live = append(live, w)
	}
	if len(live) == 0 {
		return
	}
	ix, err := p.current(true)
	if err != nil {
		for _, w := range live {
			w.done <- err
		}
		return
	}
	// The batch runs on a context of its own: a caller that gives up does
	// not abort the others' transaction.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = p.run(ctx, ix, live, p.e.ItemByItem)
	if errors.Is(err, ErrNotOwner) {
		// Another replica took the pool: stop, and let callers retry there.
		p.retire()
		p.retired = true
		p.e.lost.Add(1)
		for _, w := range live {
			w.done <- notOwner(p.poolID)
		}
		return
	}
	if err != nil {
		// The batch failed as a whole: each item again, alone.
		for _, w := range live {
			w.err, w.failed = nil, false
		}
		err = p.run(ctx, ix, live, true)
	}
	for _, w := range live {
		switch {
		case w.failed:
			w.done <- w.err
		case err != nil:
			w.done <- err
		default:
			w.done <- nil
		}
	}
}

// run is one transaction over ws; perItem puts each under a savepoint and
// writes its rows at once.
func (p *placer) run(ctx context.Context, ix *Index, ws []*work, perItem bool) (err error) {
	batchSpan := p.startBatchSpan(ws, perItem)
	defer func() { endSpan(batchSpan, err) }()
	var b *Batch
	var began time.Time
	err = p.e.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		// The transaction's hold, BEGIN to COMMIT: the write began just
		// before this callback (a retried write starts again).
		began = time.Now()
		if b != nil {
			// A retry (the last attempt lost a serialization race): its
			// index marks and its items' answers go with it.
			b.undoAll()
			for _, w := range ws {
				w.err, w.failed = nil, false
			}
		}
		if err := p.checkOwner(ctx, tx); err != nil {
			return err
		}
		b = newBatch(tx, ix, p.e.Clock.Now())
		b.immediate = perItem
		if p.e.Env != nil {
			b.env = p.e.Env.NewBatch(tx)
		}
		tenants := make([]string, 0, 1)
		for _, w := range ws {
			if w.tenant != "" && !slices.Contains(tenants, w.tenant) {
				tenants = append(tenants, w.tenant)
			}
		}
		slices.Sort(tenants)
		if err := quota.LockTenants(ctx, tx, tenants); err != nil {
			return err
		}
		if err := b.lockBudgets(ctx, tenants); err != nil {
			return err
		}
		for _, t := range tenants {
			b.lockedTenants[t] = true
		}
		for i, w := range ws {
			if w.direct && !perItem {
				// A direct item reads what it checks (quota usage, the
				// pool's rows) from the database: write what the batch
				// staged so far first, so it sees the earlier items.
				if err := b.flush(ctx); err != nil {
					return err
				}
			}
			m := b.Mark()
			item := func() (err error) {
				ictx, span := p.startItemSpan(ctx, w, batchSpan, len(ws))
				defer func() { endSpan(span, err) }()
				if err := p.item(ictx, b, w); err != nil {
					return err
				}
				if perItem || w.direct {
					return b.flush(ctx)
				}
				return nil
			}
			var err error
			if perItem || w.direct {
				err = Savepoint(ctx, tx, fmt.Sprintf("item%d", i), item)
			} else {
				err = item()
			}
			if err == nil {
				continue
			}
			b.Rewind(m)
			if errors.Is(err, store.ErrSerialization) {
				// A deadlock victim or a serialization failure is not the
				// caller's conflict: the whole transaction is tried again
				// (DB.Write retries it), as any other writer's would be.
				return err
			}
			if perItem || w.direct || refusedBeforeWriting(err) {
				w.err, w.failed = err, true
				continue
			}
			return err
		}
		if err := b.flush(ctx); err != nil {
			return err
		}
		for _, fn := range b.afterwards {
			tx.AfterCommit(fn)
		}
		return nil
	})
	if !began.IsZero() {
		held := time.Since(began)
		// A moving average of the hold, which bounds the linger.
		old := p.hold.Load()
		p.hold.Store(old - old/8 + int64(held)/8)
		if p.e.BatchObserved != nil {
			p.e.BatchObserved(len(ws), held)
		}
	}
	if b != nil && err != nil {
		b.undoAll()
	}
	if b != nil && len(b.gone) > 0 {
		p.deltaMu.Lock()
		p.recheck = append(p.recheck, b.gone...)
		p.deltaMu.Unlock()
	}
	if errors.Is(err, errStaleIndex) {
		{
			// The index missed a change: load it again for the next batch.
			p.ixMu.Lock()
			p.ix = nil
			p.ixMu.Unlock()
		}
	}
	return err
}

// item runs one work item in the batch.
func (p *placer) item(ctx context.Context, b *Batch, w *work) error {
	ctx = context.WithValue(ctx, batchKey{}, b)
	if w.direct && !b.immediate {
		// A direct item writes as it goes, bookings included, so the
		// database's refusals reach its own replan loop.
		b.immediate = true
		defer func() { b.immediate = false }()
	}
	if w.env != nil {
		return w.env(ctx, b.env)
	}
	return w.run(ctx, b)
}

type batchKey struct{}

// BatchOf returns the placer batch a mutation runs in, if any.
func BatchOf(ctx context.Context) *Batch {
	b, _ := ctx.Value(batchKey{}).(*Batch)
	return b
}

// Submit runs a mutation in the pool's placer and waits for its answer.
// direct: run writes as it goes, under a savepoint of its own.
func (e *Placers) Submit(ctx context.Context, poolID string, direct bool, run func(ctx context.Context, b *Batch) error) error {
	return e.submit(ctx, poolID, &work{direct: direct, run: run})
}

// Claim reports whether this replica places the pool (claiming it when no
// replica does) and, when another does, the API URL of that replica.
func (e *Placers) Claim(ctx context.Context, poolID string) (here bool, url string, err error) {
	p, url, err := e.claim(ctx, poolID)
	return p != nil, url, err
}

// Emit stages events of work the batch runs outside a mutation (a pending
// pass, expiries) with the batch's other events: one way for a placer
// transaction to write them, in the batch's one insert at its flush, and
// rewound with the item that emitted them.
func (b *Batch) Emit(evs ...envelope.Event) error {
	if len(evs) == 0 {
		return nil
	}
	if b.env == nil && b.emit != nil {
		for _, ev := range evs {
			b.emit(ev)
		}
		return nil
	}
	if b.env == nil {
		return errors.New("placer: a batch without an envelope cannot stage events (set Placers.Env)")
	}
	for i := range evs {
		if evs[i].Time.IsZero() {
			evs[i].Time = b.now
		}
	}
	b.env.Emit(evs...)
	return nil
}

// EmitTo makes a batch without an envelope (Immediate) hand its events to
// emit: the mutation that runs it writes them in its transaction.
func (b *Batch) EmitTo(emit func(envelope.Event)) { b.emit = emit }

// lockBudgets locks and reads the tenants' budgets (after their quota
// rows: the one global order) for the rest of the batch or the item.
func (b *Batch) lockBudgets(ctx context.Context, tenants []string) error {
	bs, err := budget.LockTenants(ctx, b.tx, tenants)
	if err != nil {
		return err
	}
	for _, t := range tenants {
		if bud, ok := bs[t]; ok {
			b.budgets[t] = &bud
		} else {
			b.budgets[t] = nil
		}
	}
	return nil
}

// checkBudget prices a charge and checks it against its tenant's budget,
// read under the lock the batch holds, counting the costs this batch
// staged before it: two bookings racing for a budget's last amount take
// turns on the budget row, and the second sees the first. The thresholds
// the booking makes the period reach go out as events with the batch.
func (b *Batch) checkBudget(ctx context.Context, c quota.Charge) error {
	if err := b.LockTenant(ctx, c.TenantID); err != nil {
		return err
	}
	bud := b.budgets[c.TenantID]
	if bud == nil {
		return nil
	}
	cost, err := budget.CostOf(ctx, b.tx, &b.prices, c)
	if err != nil {
		return err
	}
	evs, err := budget.Check(ctx, b.tx, *bud, cost, b.costs, &b.prices, b.now)
	if err != nil {
		return err
	}
	if !b.immediate {
		// Staged like the charge: counted until the flush writes the row.
		b.costs = append(b.costs, cost)
	}
	return b.Emit(evs...)
}

// Tx is the batch's transaction.
func (b *Batch) Tx() store.Tx { return b.tx }

// Now is the batch's time.
func (b *Batch) Now() time.Time { return b.now }

// Index is the pool index the batch places against; nil outside a placer.
func (b *Batch) Index() *Index { return b.ix }

// AddPending counts a reservation the batch left pending.
func (b *Batch) AddPending() { b.pending++ }

// OnUndo registers fn to undo an index change if the batch, or in the
// fallback the item, rolls back.
func (b *Batch) OnUndo(fn func()) { b.undo = append(b.undo, fn) }

// NodeChanged tells the pool's placer, after tx commits, that the atoms
// reconciler changed a node of the pool, which took the pool to version:
// the placer reads that node again instead of the whole pool.
func (e *Placers) NodeChanged(tx store.Tx, poolID, nodeID string, version int64) {
	tx.AfterCommit(func() {
		e.plMu.Lock()
		p := e.placers[poolID]
		e.plMu.Unlock()
		if p == nil {
			return
		}
		p.deltaMu.Lock()
		p.deltas[version] = append(p.deltas[version], nodeID)
		p.deltaMu.Unlock()
	})
}

// Placing reports whether a placer of this replica holds the pool now.
func (e *Placers) Placing(poolID string) bool {
	e.plMu.Lock()
	defer e.plMu.Unlock()
	return e.placers[poolID] != nil
}

// Lost counts the batches this replica's placers refused because another
// replica had claimed their pool (the fence held).
func (e *Placers) Lost() int64 { return e.lost.Load() }

// Submitted counts the mutations handed to this replica's placers.
func (e *Placers) Submitted() int64 { return e.submitted.Load() }

// Deltas counts index updates made from deltas rather than reloads.
func (e *Placers) Deltas() int64 { return e.deltas.Load() }

// refusedBeforeWriting reports whether a staged item's error is the API's
// own refusal (no capacity, a quota, a bad field), which leaves the shared
// transaction as it was. An error from the database — even wrapped as an API
// error — may have aborted it (PostgreSQL does on any error), so it fails
// the batch, and the per-item fallback finds the item.
func refusedBeforeWriting(err error) bool {
	var apiErr *envelope.Error
	if !errors.As(err, &apiErr) {
		return false
	}
	var se *store.Error
	var sqlState interface{ SQLState() string }
	return !errors.As(err, &se) && !errors.As(err, &sqlState)
}
