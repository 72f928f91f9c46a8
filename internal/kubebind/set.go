// Package kubebind is what bcd offers the node's kubelet: the GPUs booked
// by binding: kubernetes reservations on this node, their health, and
// which pods (or resource claims) hold them. The agent writes it as
// allocation.bind and allocation.release arrive; bcd's device plugin and
// DRA driver read it and record holders; a release completes only when
// no holder is left. It imports nothing of Kubernetes, so the control
// plane and the agent core stay free of those modules.
package kubebind

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Device is one GPU (or MIG instance) offered to the kubelet.
type Device struct {
	// UUID names the device to CUDA (NVIDIA_VISIBLE_DEVICES).
	UUID string
	// AllocationID is the reservation that booked it.
	AllocationID string
	// Paths are the device nodes a container needs for it (its own
	// /dev/nvidiaN besides the shared control nodes).
	Paths []string
	// Attributes published with it: model, memory, NVLink island, MIG
	// profile.
	Model        string
	MemoryMiB    int64
	NVLinkIsland string
	MIGProfile   string
	// Healthy is false once health quarantined the GPU.
	Healthy bool
}

// ErrNotOffered: a holder asked for a device this node does not offer.
var ErrNotOffered = errors.New("kubebind: device not offered")

// Set is the node's offer. The zero value is not usable; use New.
type Set struct {
	mu      sync.Mutex
	devices map[string]*Device // by UUID, offered now
	// withdrawn allocations waiting for their holders to let go, with
	// the devices they had (no longer offered).
	withdrawn map[string]*withdrawal
	// holders maps a holder (a pod UID, a claim UID) to the UUIDs it holds.
	holders    map[string][]string
	changed    chan struct{}
	registered map[string]bool
}

type withdrawal struct {
	uuids []string
	done  chan struct{}
}

// New returns an empty offer.
func New() *Set {
	return &Set{
		devices: map[string]*Device{}, withdrawn: map[string]*withdrawal{}, holders: map[string][]string{},
		changed: make(chan struct{}), registered: map[string]bool{},
	}
}

// notifyLocked wakes every watcher.
func (s *Set) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Changed is closed at the next change of the offer (devices, health).
func (s *Set) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Offer adds an allocation's devices. Offering an allocation again
// replaces its devices (a bind redelivered after a restart).
func (s *Set) Offer(allocationID string, devs []Device) error {
	if allocationID == "" {
		return errors.New("kubebind: allocation id is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range devs {
		if cur, ok := s.devices[d.UUID]; ok && cur.AllocationID != allocationID {
			return fmt.Errorf("kubebind: device %s is offered for allocation %s already", d.UUID, cur.AllocationID)
		}
		if w := s.holdingWithdrawal(d.UUID); w != "" && w != allocationID {
			return fmt.Errorf("kubebind: device %s is still held by pods of released allocation %s", d.UUID, w)
		}
	}
	for id, d := range s.devices {
		if d.AllocationID == allocationID {
			delete(s.devices, id)
		}
	}
	for _, d := range devs {
		d.AllocationID = allocationID
		d.Paths = slices.Clone(d.Paths)
		s.devices[d.UUID] = &d
	}
	s.notifyLocked()
	return nil
}

// holdingWithdrawal names the withdrawn allocation whose device uuid is,
// or "".
func (s *Set) holdingWithdrawal(uuid string) string {
	for id, w := range s.withdrawn {
		if slices.Contains(w.uuids, uuid) {
			return id
		}
	}
	return ""
}

// Withdraw stops offering an allocation's devices. The returned channel
// is closed once no holder holds any of them: at once when none does.
// Withdrawing an allocation not offered returns a closed channel.
func (s *Set) Withdraw(allocationID string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.withdrawn[allocationID]; ok {
		return w.done
	}
	w := &withdrawal{done: make(chan struct{})}
	for id, d := range s.devices {
		if d.AllocationID == allocationID {
			w.uuids = append(w.uuids, id)
			delete(s.devices, id)
		}
	}
	slices.Sort(w.uuids)
	s.withdrawn[allocationID] = w
	s.settleLocked()
	s.notifyLocked()
	return w.done
}

// settleLocked completes the withdrawals nobody holds any more.
func (s *Set) settleLocked() {
	held := map[string]bool{}
	for _, us := range s.holders {
		for _, u := range us {
			held[u] = true
		}
	}
	for id, w := range s.withdrawn {
		if !slices.ContainsFunc(w.uuids, func(u string) bool { return held[u] }) {
			close(w.done)
			delete(s.withdrawn, id)
		}
	}
}

// Held reports whether any holder holds a device of the allocation.
func (s *Set) Held(allocationID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	uuids := []string{}
	for id, d := range s.devices {
		if d.AllocationID == allocationID {
			uuids = append(uuids, id)
		}
	}
	if w, ok := s.withdrawn[allocationID]; ok {
		uuids = append(uuids, w.uuids...)
	}
	for _, us := range s.holders {
		for _, u := range us {
			if slices.Contains(uuids, u) {
				return true
			}
		}
	}
	return false
}

// SetHealth marks a device healthy or not (a quarantine).
func (s *Set) SetHealth(uuid string, healthy bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.devices[uuid]; ok && d.Healthy != healthy {
		d.Healthy = healthy
		s.notifyLocked()
	}
}

// Devices returns the offered devices, sorted by UUID.
func (s *Set) Devices() []Device {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Device, 0, len(s.devices))
	for _, u := range slices.Sorted(maps.Keys(s.devices)) {
		d := *s.devices[u]
		d.Paths = slices.Clone(d.Paths)
		out = append(out, d)
	}
	return out
}

// Device returns one offered device.
func (s *Set) Device(uuid string) (Device, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.devices[uuid]
	if !ok {
		return Device{}, false
	}
	c := *d
	c.Paths = slices.Clone(d.Paths)
	return c, true
}

// Hold records that holder holds these devices, each of which must be
// offered and healthy now. Holding again replaces what holder held.
func (s *Set) Hold(holder string, uuids []string) error {
	if holder == "" {
		return errors.New("kubebind: holder is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range uuids {
		d, ok := s.devices[u]
		if !ok {
			return fmt.Errorf("%w: %s", ErrNotOffered, u)
		}
		if !d.Healthy {
			return fmt.Errorf("kubebind: device %s is unhealthy", u)
		}
	}
	s.holders[holder] = slices.Clone(uuids)
	return nil
}

// Let records that holder holds nothing any more.
func (s *Set) Let(holder string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.holders, holder)
	s.settleLocked()
}

// SetHolders replaces every holder whose name has prefix with what is
// given (a full listing from one source, such as the kubelet's pod
// resources: holders of other sources are kept). Devices not known to
// the offer are ignored.
func (s *Set) SetHolders(prefix string, holders map[string][]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for h := range s.holders {
		if len(h) >= len(prefix) && h[:len(prefix)] == prefix {
			delete(s.holders, h)
		}
	}
	for h, us := range holders {
		if len(us) > 0 {
			s.holders[prefix+h] = slices.Clone(us)
		}
	}
	s.settleLocked()
}

// Holders returns who holds what.
func (s *Set) Holders() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]string, len(s.holders))
	for h, us := range s.holders {
		out[h] = slices.Clone(us)
	}
	return out
}

// SetRegistered records whether a kubelet plugin (the device plugin, the
// DRA driver) is registered with the kubelet.
func (s *Set) SetRegistered(plugin string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.registered[plugin] = ok
}

// Registered reports whether any kubelet plugin is registered: what
// bcd's binding.kubernetes capability follows.
func (s *Set) Registered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ok := range s.registered {
		if ok {
			return true
		}
	}
	return false
}
