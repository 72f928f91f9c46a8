// Package execrelay carries the output of a running reservations.exec from
// the node's gateway session to the API call that started it, in memory and
// within one replica: a small hub keyed by command id.
//
// It must never block the gateway session that publishes: a subscriber that
// does not keep up loses chunks, counted as dropped bytes, instead.
package execrelay

import (
	"sync"
)

// Buffer is how many chunks a subscription holds before further ones are
// dropped (each chunk is at most 32 KiB, so at most 8 MiB per exec).
const Buffer = 256

// Event is an output chunk of a running process.
type Event struct {
	// Stream is stdout or stderr.
	Stream string
	Data   []byte
}

// Exit is a process.exec command's final state, as the agent reported it.
type Exit struct {
	State       string
	Message     string
	FailureCode string
	// Result is the command's result (exit_code, signal, dropped_bytes,
	// cgroup, cgroup_entered, cgroup_note).
	Result map[string]any
}

// Hub routes events to the subscription of their command.
type Hub struct {
	mu   sync.Mutex
	subs map[string]*Subscription
}

// New returns an empty hub.
func New() *Hub { return &Hub{subs: map[string]*Subscription{}} }

// Subscription receives one command's events.
type Subscription struct {
	hub       *Hub
	commandID string
	ch        chan Event
	// exit is kept apart from ch, so that it is never the chunk dropped.
	exit    chan *Exit
	mu      sync.Mutex
	dropped uint64
	closed  bool
}

// Subscribe starts receiving commandID's events. A second subscription to
// the same command replaces the first (which then receives nothing more).
func (h *Hub) Subscribe(commandID string) *Subscription {
	s := &Subscription{hub: h, commandID: commandID, ch: make(chan Event, Buffer), exit: make(chan *Exit, 1)}
	h.mu.Lock()
	h.subs[commandID] = s
	h.mu.Unlock()
	return s
}

// Watching reports whether a subscription waits for commandID's events.
func (h *Hub) Watching(commandID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.subs[commandID] != nil
}

func (h *Hub) get(commandID string) *Subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.subs[commandID]
}

// Output publishes a chunk; without room in the subscription it is dropped
// and counted. Nobody subscribed: it is discarded.
func (h *Hub) Output(commandID, stream string, data []byte) {
	s := h.get(commandID)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	select {
	case s.ch <- Event{Stream: stream, Data: data}:
	default:
		s.dropped += uint64(len(data))
	}
}

// Exited publishes the command's end.
func (h *Hub) Exited(commandID string, e *Exit) {
	s := h.get(commandID)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	select {
	case s.exit <- e:
	default:
	}
}

// Output is the channel of output chunks.
func (s *Subscription) Output() <-chan Event { return s.ch }

// Exit delivers the end once. Every chunk was published before it, so a
// reader drains Output after it.
func (s *Subscription) Exit() <-chan *Exit { return s.exit }

// Dropped is how many bytes the relay dropped because the subscriber did
// not keep up.
func (s *Subscription) Dropped() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Close stops the subscription; safe to call twice.
func (s *Subscription) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.hub.mu.Lock()
	if s.hub.subs[s.commandID] == s {
		delete(s.hub.subs, s.commandID)
	}
	s.hub.mu.Unlock()
}
