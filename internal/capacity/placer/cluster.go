package placer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tracing"
)

// Across replicas (PostgreSQL) each pool's placer runs in exactly one: the
// replica holding the pool's session advisory lock. It claims the lock the
// first time it needs the pool and records itself, with the API URL peers
// reach it by, in placer_owners. Another replica forwards the pool's
// mutations there before deciding anything, so the owner makes the one
// decision. A replica that dies drops its database session and with it the
// lock; the next request for the pool, at any replica, claims it. A placer
// checks placer_owners under the pool's row lock in every batch, so one that
// lost its lock without noticing (a dropped connection) stops at its next
// Batch; batches of one pool take turns on that row lock either way.

// placerLockClass is the first key of every pool's advisory lock.
const placerLockClass = 0x4243504c // "BCPL"

// ForwardedHeader marks a request a replica forwarded to the pool's owner;
// the owner never forwards it again.
const ForwardedHeader = "Bc-Forwarded-By"

// ErrNotOwner: this replica's placer no longer owns the pool.
var ErrNotOwner = errors.New("the pool's placer moved to another replica")

// notOwner is what a caller hears when the pool's owner changed under it.
func notOwner(poolID string) error {
	return &envelope.Error{Code: envelope.CodeUnavailable, Message: "the placer of pool " + poolID + " is moving to another replica; retry",
		Err: ErrNotOwner, RetryAfter: time.Second}
}

// cluster is the placers' view of the other replicas.
type cluster struct {
	replicaID string
	url       string
	http      *http.Client
	// stream is http without its per-request timeout: a forwarded stream
	// lasts as long as what it relays (a process's output).
	stream *http.Client
	// lockConn holds this replica's pool locks (one session for all);
	// claimMu guards it. watchStop ends the goroutine that pings it.
	lockConn  *pgxpool.Conn
	watchStop chan struct{}
}

// SetURL sets the API URL other replicas forward this replica's pools to.
// Call it before serving.
func (e *Placers) SetURL(url string) {
	e.plMu.Lock()
	defer e.plMu.Unlock()
	e.cl().url = strings.TrimRight(url, "/")
}

// SetForwardClient sets the client this replica forwards mutations to a
// pool's owner with: replica.Identity's (mutual TLS from the internal CA,
// never a proxy). Without one this replica does not forward. Call it
// before serving.
func (e *Placers) SetForwardClient(c *http.Client) {
	e.plMu.Lock()
	defer e.plMu.Unlock()
	e.cl().http = c
	stream := *c
	stream.Timeout = 0
	e.cl().stream = &stream
}

// ReplicaID names this replica in placer_owners.
func (e *Placers) ReplicaID() string {
	e.plMu.Lock()
	defer e.plMu.Unlock()
	return e.cl().replicaID
}

func (e *Placers) cl() *cluster {
	if e.cluster == nil {
		var b [8]byte
		_, _ = rand.Read(b[:])
		e.cluster = &cluster{replicaID: "rep_" + hex.EncodeToString(b[:])}
	}
	return e.cluster
}

// claim returns the pool's placer when this replica owns the pool or can
// take it now; otherwise the owner's URL. The replica-wide plMu guards only
// the map: the lock session's round trips run under claimMu, on a context
// of their own, so a caller that gives up does not close the session (and
// with it every pool lock of the replica).
func (e *Placers) claim(ctx context.Context, poolID string) (*placer, string, error) {
	e.plMu.Lock()
	if e.stopped {
		e.plMu.Unlock()
		return nil, "", &envelope.Error{Code: envelope.CodeUnavailable, Message: "the control plane is shutting down; retry", RetryAfter: time.Second}
	}
	if p := e.placers[poolID]; p != nil {
		e.plMu.Unlock()
		return p, "", nil
	}
	if e.DB == nil || e.DB.PgxPool() == nil {
		// SQLite: one process, which owns every pool.
		p := e.startPlacer(poolID, 0)
		e.plMu.Unlock()
		return p, "", nil
	}
	c := e.cl()
	e.plMu.Unlock()

	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	e.plMu.Lock()
	p, stopped := e.placers[poolID], e.stopped
	e.plMu.Unlock()
	if stopped {
		// Stopped while this call waited its turn: a lock session opened
		// now would outlive Stop and hold its connection for good (a
		// test's database then never closed).
		return nil, "", &envelope.Error{Code: envelope.CodeUnavailable, Message: "the control plane is shutting down; retry", RetryAfter: time.Second}
	}
	if p != nil {
		// Claimed while this call waited its turn.
		return p, "", nil
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	got, err := e.tryLock(lctx, c, poolID)
	if err != nil {
		return nil, "", err
	}
	if got {
		var epoch int64
		if err := e.DB.Write(lctx, func(ctx context.Context, tx store.Tx) error {
			var err error
			epoch, err = ownerSet(ctx, tx, poolID, c.replicaID, c.url)
			return err
		}); err != nil {
			_ = e.unlock(lctx, c, poolID)
			return nil, "", err
		}
		e.plMu.Lock()
		defer e.plMu.Unlock()
		if e.stopped {
			return nil, "", &envelope.Error{Code: envelope.CodeUnavailable, Message: "the control plane is shutting down; retry", RetryAfter: time.Second}
		}
		return e.startPlacer(poolID, epoch), "", nil
	}
	var url, replica string
	err = e.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		url, replica, _, err = ownerGet(ctx, tx, poolID, false)
		return err
	})
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && (replica == c.replicaID || url == "")):
		// Locked by a replica that has not written its row yet, or by a
		// session of ours that is gone: a moment's wait settles it.
		return nil, "", notOwner(poolID)
	case err != nil:
		return nil, "", err
	}
	return nil, url, nil
}

// claimTimeout bounds a claim's round trips on the lock session.
const claimTimeout = 30 * time.Second

// checkOwner, in a batch, makes sure this replica's placer still holds the
// pool at the epoch it claimed. It reads the owner row FOR SHARE, so a claim
// by another replica (which rewrites the row) waits for this batch to
// commit, and every batch after the claim sees the new epoch and stops.
func (p *placer) checkOwner(ctx context.Context, tx store.Tx) error {
	if tx.Dialect() != store.Postgres {
		return nil
	}
	_, replica, epoch, err := ownerGet(ctx, tx, p.poolID, true)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if replica != p.e.ReplicaID() || epoch != p.epoch {
		return ErrNotOwner
	}
	return nil
}

// retire stops a placer that lost its pool: it leaves the map (the next
// request claims again), its queue is closed to new work and what waits in
// it is answered UNAVAILABLE.
func (p *placer) retire() {
	p.e.plMu.Lock()
	defer p.e.plMu.Unlock()
	p.retireLocked()
}

func (p *placer) retireLocked() {
	if p.e.placers[p.poolID] == p {
		delete(p.e.placers, p.poolID)
	}
	p.stop.Do(func() { close(p.quit) })
}

// retireAll retires every placer of this replica: its lock session died,
// and every pool lock with it.
func (e *Placers) retireAll() {
	e.plMu.Lock()
	defer e.plMu.Unlock()
	for _, p := range e.placers {
		p.retireLocked()
	}
}

// Forward sends a mutation to the replica that owns its pool, with the
// caller's credentials: the owner authenticates and decides it, once.
func Forward[Req, Res any](ctx context.Context, e *Placers, url, procedure string, req *connect.Request[Req]) (*connect.Response[Res], error) {
	client, out, err := forwardRequest(ctx, e, req, "the pool's placer is moving between replicas; retry",
		"another replica places this pool", false)
	if err != nil {
		return nil, err
	}
	res, err := connect.NewClient[Req, Res](client, url+procedure).CallUnary(ctx, out)
	if err != nil {
		return nil, forwardError(ctx, err, "the replica that places this pool did not answer; retry")
	}
	return res, nil
}

// ForwardStream is Forward for a server-streaming call: it sends the call,
// with the caller's credentials, to the replica that holds what the call
// needs (holder names it, for the caller: "node nod_…'s session"), and
// relays that replica's messages to stream until the call ends. The caller
// going away cancels the forwarded call, and so whatever the owner
// started for it.
func ForwardStream[Req, Res any](ctx context.Context, e *Placers, url, procedure, holder string, req *connect.Request[Req], stream *connect.ServerStream[Res]) error {
	client, out, err := forwardRequest(ctx, e, req, "the replica this call was forwarded to no longer holds "+holder+"; retry",
		"another replica holds "+holder, true)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res, err := connect.NewClient[Req, Res](client, url+procedure).CallServerStream(ctx, out)
	noAnswer := "the replica that holds " + holder + " did not answer; retry"
	if err != nil {
		return forwardError(ctx, err, noAnswer)
	}
	defer func() { _ = res.Close() }()
	for res.Receive() {
		if err := stream.Send(res.Msg()); err != nil {
			// The caller went away: the deferred cancel ends the owner's
			// call, which ends what it started.
			return err
		}
	}
	if err := res.Err(); err != nil {
		return forwardError(ctx, err, noAnswer)
	}
	return nil
}

// forwardRequest is the request a replica forwards for req: the caller's
// credentials, idempotency key, confirmation and trace, marked as
// forwarded, and the client to send it with (the one without a timeout for
// a stream). A request forwarded here already (moving), or a replica
// without a replica certificate while another replica serves the call
// (elsewhere), is answered UNAVAILABLE.
func forwardRequest[Req any](ctx context.Context, e *Placers, req *connect.Request[Req], moving, elsewhere string, stream bool) (*http.Client, *connect.Request[Req], error) {
	if by := req.Header().Get(ForwardedHeader); by != "" {
		// Forwarded here because this replica served the call, which it
		// no longer does: one hop only, the caller retries.
		return nil, nil, envelope.ToConnect(&envelope.Error{Code: envelope.CodeUnavailable, Message: moving, RetryAfter: time.Second})
	}
	e.plMu.Lock()
	c := e.cl()
	client := c.http
	if stream {
		client = c.stream
	}
	e.plMu.Unlock()
	if client == nil {
		// The caller's credentials go only over mutual TLS to a replica.
		return nil, nil, envelope.ToConnect(&envelope.Error{Code: envelope.CodeUnavailable,
			Message: elsewhere + " and this one has no replica certificate to forward with (set " +
				"BETTER_COMPUTE_SECRET on every replica); retry", RetryAfter: time.Second})
	}
	out := connect.NewRequest(req.Msg)
	for _, h := range []string{"Authorization", envelope.HeaderIdempotencyKey, envelope.HeaderConfirmationID, "Traceparent"} {
		if v := req.Header().Get(h); v != "" {
			out.Header().Set(h, v)
		}
	}
	if tp := tracing.Traceparent(ctx); tp != "" {
		// The owner's span continues this call's, not its caller's.
		out.Header().Set(envelope.HeaderTraceparent, tp)
	}
	out.Header().Set(ForwardedHeader, c.replicaID)
	return client, out, nil
}

// forwardError is what the caller of a forwarded call hears when it
// failed: the owner's answer, or UNAVAILABLE (noAnswer) when the owner did
// not answer.
func forwardError(ctx context.Context, err error, noAnswer string) error {
	var ce *connect.Error
	// connect-go reads a connection reset as the peer going away
	// (CANCELED); here the peer is the owner, dying under the call, and a
	// caller whose context is still live cancelled nothing: it is told to
	// retry like any caller the owner did not answer.
	if errors.As(err, &ce) && ce.Code() != connect.CodeUnavailable && ce.Code() != connect.CodeUnknown &&
		(ce.Code() != connect.CodeCanceled || ctx.Err() != nil) {
		return ce
	}
	// The owner did not answer (it may be dying): the caller retries, and
	// by then another replica serves it. The owner's error goes along as
	// text only: ToConnect would answer with a connect.Error it finds
	// wrapped, code and all.
	return envelope.ToConnect(&envelope.Error{Code: envelope.CodeUnavailable, Message: noAnswer,
		Err: errors.New(err.Error()), RetryAfter: time.Second})
}

// ReadIndex returns the pool's index to read (a preview), never to change:
// its placer's, claiming the pool when nobody places it (a pool another
// replica places answers UNAVAILABLE: the API forwards previews to the
// owner first). A placer behind the pool's version is asked to catch up
// and the call waits for it; the placer does it between batches, never in
// the middle of one, whose marks a reload would drop.
func (e *Placers) ReadIndex(ctx context.Context, poolID string) (*Index, error) {
	p, err := e.placerFor(ctx, poolID)
	if err != nil {
		return nil, err
	}
	var v int64
	if err := e.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		v, err = poolVersion(ctx, tx, poolID)
		return err
	}); err != nil {
		return nil, err
	}
	if cur := p.cur.Load(); cur != nil && cur.Version() >= v {
		return cur, nil
	}
	w := &work{ctx: ctx, done: make(chan error, 1), refresh: true}
	select {
	case p.in <- w:
	case <-p.quit:
		return nil, notOwner(poolID)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case err = <-w.done:
	case <-p.exited:
		select {
		case err = <-w.done:
		default:
			err = notOwner(poolID)
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	return p.cur.Load(), nil
}

// Stop stops every placer of this replica; what is queued is answered
// UNAVAILABLE, and nothing is placed here again.
func (e *Placers) Stop() {
	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	e.plMu.Lock()
	defer e.plMu.Unlock()
	e.stopped = true
	for _, p := range e.placers {
		p.retireLocked()
	}
	if c := e.cluster; c != nil && c.lockConn != nil {
		if c.watchStop != nil {
			close(c.watchStop)
			c.watchStop = nil
		}
		c.lockConn.Release()
		c.lockConn = nil
	}
}
