// Package tunnel joins an API client's SSH tunnel request to the byte
// stream bcd opens from the guest's host: the ticket a ticket API issues
// (its type; the control plane keeps tickets in its database, so any
// replica redeems them, once), tunnel ids waiting in memory for the node
// they were issued for, and the hop (Forward, relay.go) that carries a
// redeemed ticket to the replica holding the node's gateway session, where
// the node opens its stream.
//
// Waiting requests are in memory: a node opens its tunnel on its session,
// so the request waits on the replica holding that session, and a replica
// that redeemed the ticket elsewhere forwards it there.
package tunnel

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// TicketTTL is how long a ticket can open its tunnel.
const TicketTTL = 60 * time.Second

// Errors of attaching tunnels.
var (
	// ErrUnknownTunnel: no API request waits for this tunnel id.
	ErrUnknownTunnel = errors.New("tunnel: no request waits for this tunnel")
	// ErrWrongNode: the tunnel id was issued for another node.
	ErrWrongNode = errors.New("tunnel: the tunnel was issued for another node")
)

// Ticket is what an issued ticket is bound to.
type Ticket struct {
	TenantID   string
	InstanceID string
	// HostID is the instance's name on its host (vps.HostID).
	HostID string
	NodeID string
	Expire time.Time
}

// Hub holds the requests waiting for their node's tunnel.
type Hub struct {
	mu      sync.Mutex
	pending map[string]*Pending
}

// New returns an empty hub.
func New() *Hub {
	return &Hub{pending: map[string]*Pending{}}
}

// NewID is a random 256-bit id, URL-safe.
func NewID() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("tunnel: random id: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// Stream is the node's side of a tunnel as the gateway hands it over.
type Stream interface {
	io.ReadWriteCloser
}

// Opened is what the node sent when it opened the tunnel: the stream, or
// why it could not reach the guest.
type Opened struct {
	Stream Stream
	Err    error
}

// Pending is an API request waiting for its node to open a tunnel.
type Pending struct {
	hub    *Hub
	id     string
	nodeID string
	ch     chan Opened
}

// Expect registers tunnelID as awaited from nodeID.
func (h *Hub) Expect(tunnelID, nodeID string) *Pending {
	p := &Pending{hub: h, id: tunnelID, nodeID: nodeID, ch: make(chan Opened, 1)}
	h.mu.Lock()
	h.pending[tunnelID] = p
	h.mu.Unlock()
	return p
}

// Opened delivers the node's stream (or its failure).
func (p *Pending) Opened() <-chan Opened { return p.ch }

// Close stops waiting; a node attaching later is refused, and a stream
// handed over that nobody took (the request gave up meanwhile) is closed.
func (p *Pending) Close() {
	p.hub.mu.Lock()
	if p.hub.pending[p.id] == p {
		delete(p.hub.pending, p.id)
	}
	var left Opened
	select {
	case left = <-p.ch:
	default:
	}
	p.hub.mu.Unlock()
	if left.Stream != nil {
		_ = left.Stream.Close()
	}
}

// Attach hands the node's stream to the request waiting for tunnelID. Only
// the node the tunnel was issued for may attach, and only once; a wrong
// node leaves the request waiting for the right one.
func (h *Hub) Attach(tunnelID, nodeID string, o Opened) error {
	h.mu.Lock()
	p := h.pending[tunnelID]
	switch {
	case p == nil:
		h.mu.Unlock()
		return ErrUnknownTunnel
	case p.nodeID != nodeID:
		h.mu.Unlock()
		return ErrWrongNode
	}
	delete(h.pending, tunnelID)
	// Under the lock, so Close either sees the stream or Attach no
	// request (ch holds one, and only Attach fills it, once).
	p.ch <- o
	h.mu.Unlock()
	return nil
}

// Fail tells the request waiting for tunnelID from nodeID that the node's
// command failed (it never opened the stream: a deadline that passed, a
// node without a hypervisor), so it answers at once instead of timing out.
// A request waiting for another node is left alone.
func (h *Hub) Fail(tunnelID, nodeID string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pending[tunnelID]
	if p == nil || p.nodeID != nodeID {
		return
	}
	delete(h.pending, tunnelID)
	p.ch <- Opened{Err: err}
}

// Waiting is how many requests wait for their node.
func (h *Hub) Waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.pending)
}
