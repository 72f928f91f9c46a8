package bctest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// FakeHypervisor answers the vmcmd contract (instance.* and volume.*) with
// in-memory guests, as bcd's runtime does with QEMU: a simulated node runs
// it as its agent's command handler, so instances go through the real
// gateway, command path and agent protocol. A running guest's sshd is a
// real SSH server on loopback, configured from its seed (fakesshd.go), that
// runs commands with /bin/sh in <root>/<instance>/fs; instance.tunnel
// reaches it as bcd reaches a real guest's. Where this process can (root,
// user namespaces), each guest's commands run confined as bcd confines an
// allocation's processes: a uid of the guest's own, new namespaces, its fs
// directory and a /tmp of its own, and nothing of the node's state or of
// the other guests reachable.
type FakeHypervisor struct {
	mu      sync.Mutex
	images  []string
	guests  map[string]*fakeGuest
	volumes map[string]vmcmd.VolumeParams
	// degraded is what the host reports it cannot apply (e.g. huge_pages).
	degraded []string
	// holdVolumes are volumes running guests do not release (HoldVolume).
	holdVolumes map[string]bool
	closed      bool
	// root holds each guest's files (<root>/<instance>/fs) and the
	// snapshots of them (<root>/snapshots/<instance>/<snapshot>/fs).
	root string
	// uncertified makes later guests ignore their seeded host key and
	// certificate (a guest whose host key the CA never signed).
	uncertified bool
	// hide are host paths no guest's command may reach besides root (the
	// node's state directory; dev's).
	hide []string
}

type fakeGuest struct {
	params      vmcmd.CreateParams
	state       string
	dir         string
	jail        *guestJail
	uncertified bool
	sshd        *fakeSSHD
	ran         int
	// peers is the latest peer list (instance.peers), nil until one came:
	// kept apart from params so a redelivered create still compares equal.
	peers []string
}

// FakeGuestImages are the images a FakeHypervisor holds by default.
var FakeGuestImages = []string{"debian-12"}

// NewFakeHypervisor returns a hypervisor holding the given guest images
// (default FakeGuestImages).
func NewFakeHypervisor(images ...string) *FakeHypervisor {
	if len(images) == 0 {
		images = FakeGuestImages
	}
	return &FakeHypervisor{images: images, guests: map[string]*fakeGuest{}, volumes: map[string]vmcmd.VolumeParams{}}
}

// Capabilities are what a node running this hypervisor enforces (all of
// them, in memory).
func (h *FakeHypervisor) Capabilities() []string {
	return []string{vmcmd.CapInstances, vmcmd.CapPlacement, vmcmd.CapVolumes, vmcmd.CapNetworkPolicy, vmcmd.CapSnapshot}
}

// SetRoot sets the directory that holds the guests' files and their
// snapshots (a FakeDaemon sets <state dir>/guests when none is set).
func (h *FakeHypervisor) SetRoot(dir string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.root = dir
}

// Hide adds host paths that guests' commands must not reach (the
// guests' root is always out of their reach, but for each guest's own
// directory).
func (h *FakeHypervisor) Hide(paths ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range paths {
		if p != "" && !slices.Contains(h.hide, p) {
			h.hide = append(h.hide, p)
		}
	}
}

// Root is the directory holding the guests' fs directories.
func (h *FakeHypervisor) Root() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.root
}

// SetUncertifiedHostKeys makes guests created later present a host key of
// their own instead of the seeded, CA-certified one.
func (h *FakeHypervisor) SetUncertifiedHostKeys(on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.uncertified = on
}

// CommandsRun is how many commands a guest's sshd ran (across restarts).
func (h *FakeHypervisor) CommandsRun(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	g, ok := h.guests[id]
	if !ok {
		return 0
	}
	n := g.ran
	if g.sshd != nil {
		n += g.sshd.ran()
	}
	return n
}

// DialGuest connects to a running guest's sshd, as bcd's hypervisor does
// for instance.tunnel.
func (h *FakeHypervisor) DialGuest(ctx context.Context, id string) (net.Conn, error) {
	h.mu.Lock()
	g, ok := h.guests[id]
	addr := ""
	if ok && g.sshd != nil {
		addr = g.sshd.addr()
	}
	h.mu.Unlock()
	switch {
	case !ok:
		return nil, agent.CommandError(vmcmd.FailNotFound, fmt.Errorf("no instance %s", id))
	case addr == "":
		return nil, agent.CommandError(vmcmd.FailRuntime, fmt.Errorf("instance %s is %s: its sshd does not answer", id, g.state))
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// GuestDir is the directory a fake guest's files live in: its sshd's
// HOME and cwd.
func (h *FakeHypervisor) GuestDir(id string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.guestDirLocked(id)
}

func (h *FakeHypervisor) guestDirLocked(id string) string {
	return filepath.Join(h.root, id, "fs")
}

// snapshotLocked copies the guest's files aside, as bcd saves a guest's
// memory and disks; taking a snapshot id again keeps the first copy.
func (h *FakeHypervisor) snapshotLocked(p vmcmd.SnapshotParams) error {
	if h.root == "" {
		return errors.New("the fake hypervisor has no root for guest files")
	}
	dst := filepath.Join(h.root, "snapshots", p.InstanceID, p.SnapshotID)
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	src := h.guestDirLocked(p.InstanceID)
	if err := os.MkdirAll(src, 0o700); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(tmp), 0o700); err != nil {
		return err
	}
	if err := os.CopyFS(filepath.Join(tmp, "fs"), os.DirFS(src)); err != nil {
		return err
	}
	// What bcd's snapshot spec says of the disk: which image it is an
	// overlay on, and its size (a create from the snapshot checks both).
	if g, ok := h.guests[p.InstanceID]; ok {
		b, err := json.Marshal(fakeSnapshotSpec{Image: g.params.Image.Name, DiskMiB: g.params.DiskMiB})
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, "spec.json"), b, 0o600); err != nil {
			return err
		}
	}
	return os.Rename(tmp, dst)
}

// fakeSnapshotSpec is the part of bcd's snapshot spec.json a create from
// the snapshot checks.
type fakeSnapshotSpec struct {
	Image   string `json:"image"`
	DiskMiB int    `json:"disk_mib"`
}

// fromSnapshotLocked checks a create's from_snapshot as bcd does (ids, the
// snapshot on this host, the same image, a disk no larger than the new
// one) and returns the snapshot's files to seed the guest with.
func (h *FakeHypervisor) fromSnapshotLocked(p *vmcmd.CreateParams) (string, error) {
	fs := p.FromSnapshot
	switch {
	case !vmcmd.ValidID(fs.InstanceID):
		return "", invalid("from_snapshot.instance_id: %q is not an instance id (1-63 of a-z, 0-9 and '-')", fs.InstanceID)
	case !vmcmd.ValidID(fs.SnapshotID):
		return "", invalid("from_snapshot.snapshot_id: %q is not a snapshot id (1-63 of a-z, 0-9 and '-')", fs.SnapshotID)
	}
	missing := agent.CommandError(vmcmd.FailNotFound, fmt.Errorf("instance.create: from_snapshot: instance %q has no snapshot %q on this host", fs.InstanceID, fs.SnapshotID))
	if h.root == "" {
		return "", missing
	}
	dir := filepath.Join(h.root, "snapshots", fs.InstanceID, fs.SnapshotID)
	if _, err := os.Stat(filepath.Join(dir, "fs")); err != nil {
		return "", missing
	}
	if b, err := os.ReadFile(filepath.Join(dir, "spec.json")); err == nil {
		var snap fakeSnapshotSpec
		if err := json.Unmarshal(b, &snap); err != nil {
			return "", agent.CommandError(vmcmd.FailRuntime, fmt.Errorf("instance.create: from_snapshot: snapshot %q of %q: unreadable spec: %w", fs.SnapshotID, fs.InstanceID, err))
		}
		if snap.Image != p.Image.Name {
			return "", invalid("from_snapshot: snapshot %q of %q is of the image %s, not %s (this instance's image)", fs.SnapshotID, fs.InstanceID, snap.Image, p.Image.Name)
		}
		if snap.DiskMiB > p.DiskMiB {
			return "", invalid("from_snapshot: snapshot %q of %q has a %d MiB disk, larger than disk_mib (%d)", fs.SnapshotID, fs.InstanceID, snap.DiskMiB, p.DiskMiB)
		}
	}
	return filepath.Join(dir, "fs"), nil
}

// deleteSnapshotsLocked removes an instance's snapshots but the kept ones,
// and its snapshot directory once it holds none.
func (h *FakeHypervisor) deleteSnapshotsLocked(id string, keep []string) error {
	dir := filepath.Join(h.root, "snapshots", id)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !slices.Contains(keep, e.Name()) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return removeEmptyDir(dir)
}

func removeEmptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil || len(entries) > 0 {
		return err
	}
	return os.Remove(dir)
}

var errNoSnapshot = errors.New("no such snapshot")

// restoreLocked puts a snapshot's files back in place of the guest's.
func (h *FakeHypervisor) restoreLocked(p vmcmd.SnapshotParams) error {
	snap := filepath.Join(h.root, "snapshots", p.InstanceID, p.SnapshotID, "fs")
	if h.root == "" {
		snap = ""
	}
	if _, err := os.Stat(snap); snap == "" || err != nil {
		return fmt.Errorf("instance %q has no snapshot %q on this host: %w", p.InstanceID, p.SnapshotID, errNoSnapshot)
	}
	dst := h.guestDirLocked(p.InstanceID)
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	return os.CopyFS(dst, os.DirFS(snap))
}

// SetDegraded makes later creates report that the host could not apply
// these placement asks (the instance's PlacementDegraded condition).
func (h *FakeHypervisor) SetDegraded(asks ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.degraded = asks
}

// Guests reports every guest the hypervisor holds, by instance id.
func (h *FakeHypervisor) Guests() []vmcmd.Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []vmcmd.Status
	for id, g := range h.guests {
		out = append(out, h.status(id, g))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].InstanceID < out[j].InstanceID })
	return out
}

// Guest returns one guest's create params, and whether it exists.
func (h *FakeHypervisor) Guest(id string) (vmcmd.CreateParams, string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g, ok := h.guests[id]
	if !ok {
		return vmcmd.CreateParams{}, "", false
	}
	return g.params, g.state, true
}

// Peers returns the peer list a guest's network policy admits now: the
// latest instance.peers, else its create's; ok is false without the guest.
func (h *FakeHypervisor) Peers(id string) (peers []string, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g, ok := h.guests[id]
	if !ok {
		return nil, false
	}
	if g.peers != nil {
		return slices.Clone(g.peers), true
	}
	return slices.Clone(g.params.Network.Peers), true
}

// Volumes lists the volume ids the hypervisor holds.
func (h *FakeHypervisor) Volumes() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for id := range h.volumes {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Drop makes a guest vanish, as when its QEMU died with the host's
// reboot: the host no longer reports it.
func (h *FakeHypervisor) Drop(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if g, ok := h.guests[id]; ok {
		g.stopSSH()
		delete(h.guests, id)
	}
}

// Close stops every guest's listener (the machine went away).
func (h *FakeHypervisor) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, g := range h.guests {
		g.stopSSH()
	}
}

// reopen takes a closed hypervisor back into service for a restarted
// node: its guests kept running, as bcd re-adopts QEMU processes.
func (h *FakeHypervisor) reopen() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		return
	}
	h.closed = false
	for _, g := range h.guests {
		if g.state == vmcmd.StateRunning {
			_ = g.startSSH()
		}
	}
}

func (h *FakeHypervisor) status(id string, g *fakeGuest) vmcmd.Status {
	st := vmcmd.Status{InstanceID: id, State: g.state, Accel: "tcg", Tap: "tap-" + id[:min(len(id), 8)]}
	if g.sshd != nil {
		st.SSHAddress = g.sshd.addr()
	}
	if g.params.Placement.HugePages || len(g.params.Placement.HostCPUs) > 0 {
		st.Degraded = slices.Clone(h.degraded)
	}
	return st
}

func (g *fakeGuest) startSSH() error {
	if g.sshd != nil {
		return nil
	}
	cfg, err := sshdConfig(g.params.Seed, g.uncertified, time.Now)
	if err != nil {
		return err
	}
	d, err := startSSHD(cfg, g.dir, g.jail)
	if err != nil {
		return err
	}
	g.sshd = d
	return nil
}

func (g *fakeGuest) stopSSH() {
	if g.sshd != nil {
		g.ran += g.sshd.ran()
		g.sshd.close()
		g.sshd = nil
	}
}

// rootDir is the guests' directory, made on first use when unset.
func (h *FakeHypervisor) rootDir() (string, error) {
	if h.root == "" {
		dir, err := os.MkdirTemp("", "bc-fake-guests-")
		if err != nil {
			return "", err
		}
		h.root = dir
	}
	return h.root, nil
}

func result(v any) (*structpb.Struct, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return structpb.NewStruct(m)
}

func invalid(format string, args ...any) error {
	return agent.CommandError(vmcmd.FailInvalid, fmt.Errorf(format, args...))
}

// Apply carries out one vmcmd command (Runner adapts it for the agent).
func (h *FakeHypervisor) Apply(_ context.Context, c *agentv1.Command) (*structpb.Struct, error) {
	if !slices.Contains(vmcmd.Kinds, c.GetKind()) {
		return nil, agent.CommandError(agent.FailUnknownKind, fmt.Errorf("unknown command kind %q", c.GetKind()))
	}
	raw, err := c.GetParams().MarshalJSON()
	if err != nil {
		return nil, invalid("params: %v", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, agent.CommandError(vmcmd.FailRuntime, errors.New("the hypervisor is closed"))
	}
	switch c.GetKind() {
	case vmcmd.KindInstanceCreate:
		var p vmcmd.CreateParams
		if err := vmcmd.Decode(raw, &p); err != nil {
			return nil, invalid("%v", err)
		}
		return h.create(&p)
	case vmcmd.KindVolumeCreate, vmcmd.KindVolumeDelete:
		var p vmcmd.VolumeParams
		if err := vmcmd.Decode(raw, &p); err != nil {
			return nil, invalid("%v", err)
		}
		if !vmcmd.ValidID(p.VolumeID) {
			return nil, invalid("volume_id %q is not a host id", p.VolumeID)
		}
		if c.GetKind() == vmcmd.KindVolumeCreate {
			h.volumes[p.VolumeID] = p
			return result(map[string]any{"volume_id": p.VolumeID})
		}
		for id, g := range h.guests {
			for _, v := range g.params.Volumes {
				if v.VolumeID == p.VolumeID {
					return nil, agent.CommandError(vmcmd.FailBusy, fmt.Errorf("volume %s is attached to %s", p.VolumeID, id))
				}
			}
		}
		delete(h.volumes, p.VolumeID)
		return result(map[string]any{"volume_id": p.VolumeID})
	case vmcmd.KindVolumeAttach, vmcmd.KindVolumeDetach:
		var p vmcmd.AttachParams
		if err := vmcmd.Decode(raw, &p); err != nil {
			return nil, invalid("%v", err)
		}
		return h.attach(c.GetKind(), p)
	case vmcmd.KindInstanceList:
		var out vmcmd.ListResult
		for id, g := range h.guests {
			out.Instances = append(out.Instances, h.status(id, g))
		}
		return result(out)
	case vmcmd.KindInstanceTunnel:
		// bcd's agent opens tunnels itself (DialGuest); a tunnel reaching
		// the hypervisor as a plain command has nothing to carry it.
		return nil, agent.CommandError(vmcmd.FailUnsupported, errors.New("instance.tunnel is carried by the agent"))
	case vmcmd.KindInstancePeers:
		var p vmcmd.PeersParams
		if err := vmcmd.Decode(raw, &p); err != nil {
			return nil, invalid("%v", err)
		}
		g, ok := h.guests[p.InstanceID]
		if !ok {
			return nil, agent.CommandError(vmcmd.FailNotFound, fmt.Errorf("no instance %s", p.InstanceID))
		}
		g.peers = append([]string{}, p.Peers...)
		return result(h.status(p.InstanceID, g))
	case vmcmd.KindSnapshotDelete:
		var p vmcmd.SnapshotParams
		if err := vmcmd.Decode(raw, &p); err != nil {
			return nil, invalid("%v", err)
		}
		if !vmcmd.ValidID(p.InstanceID) || !vmcmd.ValidID(p.SnapshotID) {
			return nil, invalid("instance_id %q or snapshot_id %q is not a host id", p.InstanceID, p.SnapshotID)
		}
		if h.root != "" {
			dir := filepath.Join(h.root, "snapshots", p.InstanceID, p.SnapshotID)
			if err := os.RemoveAll(dir); err != nil {
				return nil, agent.CommandError(vmcmd.FailRuntime, err)
			}
			if err := removeEmptyDir(filepath.Dir(dir)); err != nil {
				return nil, agent.CommandError(vmcmd.FailRuntime, err)
			}
		}
		return result(vmcmd.SnapshotDeleted(p))
	case vmcmd.KindInstanceSnapshot, vmcmd.KindInstanceRestore:
		var p vmcmd.SnapshotParams
		if err := vmcmd.Decode(raw, &p); err != nil {
			return nil, invalid("%v", err)
		}
		g, ok := h.guests[p.InstanceID]
		if !ok {
			return nil, agent.CommandError(vmcmd.FailNotFound, fmt.Errorf("no instance %s", p.InstanceID))
		}
		if !vmcmd.ValidID(p.SnapshotID) {
			return nil, invalid("snapshot_id %q is not a host id", p.SnapshotID)
		}
		op := h.snapshotLocked
		if c.GetKind() == vmcmd.KindInstanceRestore {
			op = h.restoreLocked
		}
		if err := op(p); err != nil {
			code := vmcmd.FailRuntime
			if errors.Is(err, errNoSnapshot) {
				code = vmcmd.FailNotFound
			}
			return nil, agent.CommandError(code, err)
		}
		return result(h.status(p.InstanceID, g))
	}
	if c.GetKind() == vmcmd.KindInstanceDelete {
		var p vmcmd.DeleteParams
		if err := vmcmd.Decode(raw, &p); err != nil {
			return nil, invalid("%v", err)
		}
		for i, s := range p.KeepSnapshots {
			if !vmcmd.ValidID(s) {
				return nil, invalid("keep_snapshots[%d]: %q is not a snapshot id", i, s)
			}
		}
		if g, ok := h.guests[p.InstanceID]; ok {
			g.stopSSH()
			delete(h.guests, p.InstanceID)
		}
		if h.root != "" {
			// A guest's files and snapshots go with it, as bcd's do, but
			// for the snapshots it keeps.
			if err := os.RemoveAll(filepath.Join(h.root, p.InstanceID)); err != nil {
				return nil, agent.CommandError(vmcmd.FailRuntime, err)
			}
			if err := h.deleteSnapshotsLocked(p.InstanceID, p.KeepSnapshots); err != nil {
				return nil, agent.CommandError(vmcmd.FailRuntime, err)
			}
		}
		return result(vmcmd.Status{InstanceID: p.InstanceID, State: vmcmd.StateDeleted})
	}
	var ref vmcmd.InstanceRef
	if err := vmcmd.Decode(raw, &ref); err != nil {
		return nil, invalid("%v", err)
	}
	g, ok := h.guests[ref.InstanceID]
	if !ok {
		return nil, agent.CommandError(vmcmd.FailNotFound, fmt.Errorf("no instance %s", ref.InstanceID))
	}
	switch c.GetKind() {
	case vmcmd.KindInstanceStart, vmcmd.KindInstanceResume, vmcmd.KindInstanceReboot:
		g.state = vmcmd.StateRunning
		if err := g.startSSH(); err != nil {
			return nil, agent.CommandError(vmcmd.FailRuntime, err)
		}
	case vmcmd.KindInstanceStop:
		g.state = vmcmd.StateStopped
		g.stopSSH()
	case vmcmd.KindInstancePause:
		g.state = vmcmd.StatePaused
	}
	return result(h.status(ref.InstanceID, g))
}

// attach plugs a volume into a guest (or takes it out) as bcd's
// hypervisor does: idempotent both ways, busy when another guest holds
// the volume, not found for a volume or guest the host lacks. The guest's
// create params carry its volumes, so a delete of an attached volume is
// busy here too. Held volumes make a running guest keep them (FailBusy on
// detach), as a guest with the disk mounted does.
func (h *FakeHypervisor) attach(kind string, p vmcmd.AttachParams) (*structpb.Struct, error) {
	if !vmcmd.ValidID(p.InstanceID) || !vmcmd.ValidID(p.VolumeID) {
		return nil, invalid("instance_id %q or volume_id %q is not a host id", p.InstanceID, p.VolumeID)
	}
	g, ok := h.guests[p.InstanceID]
	if !ok {
		return nil, agent.CommandError(vmcmd.FailNotFound, fmt.Errorf("no instance %s", p.InstanceID))
	}
	i := slices.IndexFunc(g.params.Volumes, func(v vmcmd.VolumeRef) bool { return v.VolumeID == p.VolumeID })
	if kind == vmcmd.KindVolumeDetach {
		if i >= 0 {
			if h.holdVolumes[p.VolumeID] && g.state == vmcmd.StateRunning {
				return nil, agent.CommandError(vmcmd.FailBusy, fmt.Errorf("the guest did not release volume %s", p.VolumeID))
			}
			g.params.Volumes = slices.Delete(slices.Clone(g.params.Volumes), i, i+1)
		}
		return result(h.status(p.InstanceID, g))
	}
	if i >= 0 {
		return result(h.status(p.InstanceID, g))
	}
	vol, ok := h.volumes[p.VolumeID]
	if !ok {
		return nil, agent.CommandError(vmcmd.FailNotFound, fmt.Errorf("volume %s is not on this host", p.VolumeID))
	}
	if p.Format != vol.Format {
		return nil, invalid("format: volume %s is %s, not %q", p.VolumeID, vol.Format, p.Format)
	}
	for id, other := range h.guests {
		if slices.ContainsFunc(other.params.Volumes, func(v vmcmd.VolumeRef) bool { return v.VolumeID == p.VolumeID }) {
			return nil, agent.CommandError(vmcmd.FailBusy, fmt.Errorf("volume %s is attached to instance %s", p.VolumeID, id))
		}
	}
	g.params.Volumes = append(slices.Clone(g.params.Volumes), vmcmd.VolumeRef(vol))
	return result(h.status(p.InstanceID, g))
}

// HoldVolume makes running guests keep a volume: its detach fails busy,
// as when the guest has it mounted and does not release the device.
func (h *FakeHypervisor) HoldVolume(id string, hold bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holdVolumes == nil {
		h.holdVolumes = map[string]bool{}
	}
	h.holdVolumes[id] = hold
}

// DropVolume removes a volume's file from the host behind the control
// plane's back (an operator's rm): its attach then fails not found.
func (h *FakeHypervisor) DropVolume(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.volumes, id)
}

// GuestVolumes lists the volume ids a guest holds now (nil without the
// guest).
func (h *FakeHypervisor) GuestVolumes(id string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	g, ok := h.guests[id]
	if !ok {
		return nil
	}
	out := []string{}
	for _, v := range g.params.Volumes {
		out = append(out, v.VolumeID)
	}
	return out
}

func (h *FakeHypervisor) create(p *vmcmd.CreateParams) (*structpb.Struct, error) {
	switch {
	case !vmcmd.ValidID(p.InstanceID):
		return nil, invalid("instance_id %q is not a host id", p.InstanceID)
	case p.VCPUs < 1 || p.MemoryMiB < 1:
		return nil, invalid("vcpus and memory_mib must be positive")
	case p.Network.Policy != vmcmd.PolicyEgress && p.Network.Policy != vmcmd.PolicyPrivate && p.Network.Policy != vmcmd.PolicyNone:
		return nil, invalid("network.policy %q", p.Network.Policy)
	case !slices.Contains(h.images, p.Image.Name):
		return nil, agent.CommandError(vmcmd.FailImage, fmt.Errorf("guest image %q is not on this host", p.Image.Name))
	}
	if g, ok := h.guests[p.InstanceID]; ok {
		// Redelivered: the same spec answers its status; another is refused.
		if !reflect.DeepEqual(g.params, *p) {
			return nil, agent.CommandError(vmcmd.FailExists, fmt.Errorf("instance %s exists with another spec", p.InstanceID))
		}
		return result(h.status(p.InstanceID, g))
	}
	for _, v := range p.Volumes {
		if !vmcmd.ValidID(v.VolumeID) {
			return nil, invalid("volumes: %q is not a host id", v.VolumeID)
		}
	}
	// A snapshot's files seed the guest's, as a snapshot's disk seeds
	// bcd's guest; checked before anything is made.
	var from string
	if p.FromSnapshot != nil {
		var err error
		if from, err = h.fromSnapshotLocked(p); err != nil {
			return nil, err
		}
	}
	root, err := h.rootDir()
	if err != nil {
		return nil, agent.CommandError(vmcmd.FailRuntime, err)
	}
	g := &fakeGuest{params: *p, state: vmcmd.StateRunning, dir: filepath.Join(root, p.InstanceID, "fs"), uncertified: h.uncertified}
	if from != "" {
		// A stale directory of an earlier guest with this id goes first.
		if err := os.RemoveAll(g.dir); err != nil {
			return nil, agent.CommandError(vmcmd.FailRuntime, err)
		}
		if err := os.CopyFS(g.dir, os.DirFS(from)); err != nil {
			_ = os.RemoveAll(filepath.Join(root, p.InstanceID))
			return nil, agent.CommandError(vmcmd.FailRuntime, err)
		}
	}
	for _, v := range p.Volumes {
		h.volumes[v.VolumeID] = vmcmd.VolumeParams(v)
	}
	g.jail = &guestJail{uid: nextGuestID(), dir: g.dir, tmp: filepath.Join(root, p.InstanceID, "tmp"),
		hide: append([]string{root}, h.hide...)}
	if p.Paused {
		g.state = vmcmd.StatePaused
	} else if err := g.startSSH(); err != nil {
		return nil, agent.CommandError(vmcmd.FailRuntime, err)
	}
	h.guests[p.InstanceID] = g
	return result(h.status(p.InstanceID, g))
}

// Runner is the hypervisor as bcd's agent.InstanceRunner: the agent runs
// instance commands aside from its others, in order per instance, exactly
// as it runs the real hypervisor's.
func (h *FakeHypervisor) Runner() agent.InstanceRunner { return fakeRunner{h} }

type fakeRunner struct{ h *FakeHypervisor }

func (r fakeRunner) Capabilities() []string { return r.h.Capabilities() }

func (r fakeRunner) DialGuest(ctx context.Context, id string) (net.Conn, error) {
	return r.h.DialGuest(ctx, id)
}

func (r fakeRunner) Apply(ctx context.Context, kind string, params []byte) (any, error) {
	st := &structpb.Struct{}
	if err := protojson.Unmarshal(params, st); err != nil {
		return nil, invalid("params: %v", err)
	}
	res, err := r.h.Apply(ctx, &agentv1.Command{Kind: kind, Params: st})
	if err != nil {
		return nil, err
	}
	if res == nil {
		return map[string]any{}, nil
	}
	b, err := protojson.Marshal(res)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(b), nil
}
