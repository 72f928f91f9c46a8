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
	// lockConn holds this replica's pool locks (one session for all).
	lockConn *pgxpool.Conn
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
// take it now; otherwise the owner's URL.
func (e *Placers) claim(ctx context.Context, poolID string) (*placer, string, error) {
	e.plMu.Lock()
	defer e.plMu.Unlock()
	if e.stopped {
		return nil, "", &envelope.Error{Code: envelope.CodeUnavailable, Message: "the control plane is shutting down; retry", RetryAfter: time.Second}
	}
	if p := e.placers[poolID]; p != nil {
		return p, "", nil
	}
	if e.DB == nil || e.DB.PgxPool() == nil {
		// SQLite: one process, which owns every pool.
		return e.startPlacer(poolID), "", nil
	}
	c := e.cl()
	got, err := e.tryLock(ctx, c, poolID)
	if err != nil {
		return nil, "", err
	}
	if got {
		if err := e.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			return ownerSet(ctx, tx, poolID, c.replicaID, c.url)
		}); err != nil {
			_ = e.unlock(ctx, c, poolID)
			return nil, "", err
		}
		return e.startPlacer(poolID), "", nil
	}
	var url, replica string
	err = e.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		url, replica, err = ownerGet(ctx, tx, poolID)
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

// checkOwner, in a batch, makes sure this replica still owns the pool.
func (p *placer) checkOwner(ctx context.Context, tx store.Tx) error {
	if tx.Dialect() != store.Postgres {
		return nil
	}
	_, replica, err := ownerGet(ctx, tx, p.poolID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if replica != p.e.ReplicaID() {
		return ErrNotOwner
	}
	return nil
}

// retire stops a placer that lost its pool; the next request claims again.
func (p *placer) retire() {
	p.e.plMu.Lock()
	defer p.e.plMu.Unlock()
	if p.e.placers[p.poolID] == p {
		delete(p.e.placers, p.poolID)
	}
}

// Forward sends a mutation to the replica that owns its pool, with the
// caller's credentials: the owner authenticates and decides it, once.
func Forward[Req, Res any](ctx context.Context, e *Placers, url, procedure string, req *connect.Request[Req]) (*connect.Response[Res], error) {
	if by := req.Header().Get(ForwardedHeader); by != "" {
		// Forwarded here because this replica owned the pool, which it
		// no longer does: one hop only, the caller retries.
		return nil, envelope.ToConnect(&envelope.Error{Code: envelope.CodeUnavailable,
			Message: "the pool's placer is moving between replicas; retry", RetryAfter: time.Second})
	}
	e.plMu.Lock()
	c := e.cl()
	client := c.http
	e.plMu.Unlock()
	if client == nil {
		// The caller's credentials go only over mutual TLS to a replica.
		return nil, envelope.ToConnect(&envelope.Error{Code: envelope.CodeUnavailable,
			Message: "another replica places this pool and this one has no replica certificate to forward with (set " +
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
	res, err := connect.NewClient[Req, Res](client, url+procedure).CallUnary(ctx, out)
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) && ce.Code() != connect.CodeUnavailable && ce.Code() != connect.CodeUnknown {
			return nil, ce
		}
		// The owner did not answer (it may be dying): the caller retries,
		// and by then the pool has an owner that does.
		return nil, envelope.ToConnect(&envelope.Error{Code: envelope.CodeUnavailable,
			Message: "the replica that places this pool did not answer; retry", Err: err, RetryAfter: time.Second})
	}
	return res, nil
}

// ReadIndex returns an index of the pool to read (a preview): the placer's
// when this replica owns the pool, else a copy loaded here and reloaded when
// the pool's version moves.
func (e *Placers) ReadIndex(ctx context.Context, poolID string) (*Index, error) {
	p, _, err := e.claim(ctx, poolID)
	if err == nil && p != nil {
		return p.current(true)
	}
	var ix *Index
	err = e.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		ix, err = e.index(ctx, tx, poolID, e.Clock.Now())
		return err
	})
	return ix, err
}

// Stop stops every placer of this replica; what is queued is answered
// UNAVAILABLE, and nothing is placed here again.
func (e *Placers) Stop() {
	e.plMu.Lock()
	defer e.plMu.Unlock()
	e.stopped = true
	for id, p := range e.placers {
		close(p.quit)
		delete(e.placers, id)
	}
	if c := e.cluster; c != nil && c.lockConn != nil {
		c.lockConn.Release()
		c.lockConn = nil
	}
}
