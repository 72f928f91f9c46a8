package hypervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/better-compute/better-compute/internal/agent/runtime"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// validate checks what the runtime's own validation does not see (the
// vmcmd shape: policy, peers, placement asks) and what it would report
// under other field names; the runtime checks the rest.
func validate(p *vmcmd.CreateParams) error {
	if !vmcmd.ValidID(p.InstanceID) {
		return invalid("instance_id", "%q is not an instance id (1-63 of a-z, 0-9 and '-')", p.InstanceID)
	}
	if p.VCPUs < 1 || p.VCPUs > runtime.MaxVCPUs {
		return invalid("vcpus", "must be 1..%d, got %d", runtime.MaxVCPUs, p.VCPUs)
	}
	if p.MemoryMiB < runtime.MinMemoryMiB || p.MemoryMiB > runtime.MaxMemoryMiB {
		return invalid("memory_mib", "must be %d..%d, got %d", runtime.MinMemoryMiB, runtime.MaxMemoryMiB, p.MemoryMiB)
	}
	if f := p.BalloonFloorMiB; f != 0 && (f < runtime.MinMemoryMiB || f > p.MemoryMiB) {
		return invalid("balloon_floor_mib", "must be 0 (no balloon) or %d..memory_mib (%d), got %d", runtime.MinMemoryMiB, p.MemoryMiB, f)
	}
	if p.BalloonFloorMiB != 0 && p.Placement.HugePages {
		return invalid("balloon_floor_mib", "hugepage-backed memory cannot balloon")
	}
	if p.DiskMiB < 0 {
		return invalid("disk_mib", "must not be negative, got %d", p.DiskMiB)
	}
	n := &p.Network
	hw, err := net.ParseMAC(n.MAC)
	if err != nil || len(hw) != 6 || hw[0]&1 == 1 {
		return invalid("network.mac", "%q is not a unicast MAC address", n.MAC)
	}
	addr, err := netip.ParsePrefix(n.Address)
	if err != nil || !addr.Addr().Is4() {
		return invalid("network.address", "%q is not an IPv4 address/prefix (10.0.0.5/24)", n.Address)
	}
	if n.Gateway != "" {
		g, err := netip.ParseAddr(n.Gateway)
		if err != nil || !g.Is4() {
			return invalid("network.gateway", "%q is not an IPv4 address", n.Gateway)
		}
		if !addr.Masked().Contains(g) {
			return invalid("network.gateway", "%s is outside %s", g, addr.Masked())
		}
	}
	for i, d := range n.DNS {
		if _, err := netip.ParseAddr(d); err != nil {
			return invalid(fmt.Sprintf("network.dns[%d]", i), "%q is not an IP address", d)
		}
	}
	switch n.Policy {
	case "", vmcmd.PolicyEgress, vmcmd.PolicyPrivate, vmcmd.PolicyNone:
	default:
		return invalid("network.policy", "%q is not egress, private or none", n.Policy)
	}
	for i, peer := range n.Peers {
		if _, err := netip.ParseAddr(peer); err != nil {
			return invalid(fmt.Sprintf("network.peers[%d]", i), "%q is not an IP address", peer)
		}
	}
	if len(p.Volumes) > runtime.MaxVolumes {
		return invalid("volumes", "at most %d, got %d", runtime.MaxVolumes, len(p.Volumes))
	}
	seen := map[string]bool{}
	for i, v := range p.Volumes {
		f := fmt.Sprintf("volumes[%d]", i)
		if !vmcmd.ValidID(v.VolumeID) {
			return invalid(f+".volume_id", "%q is not a volume id (1-63 of a-z, 0-9 and '-')", v.VolumeID)
		}
		if seen[v.VolumeID] {
			return invalid(f+".volume_id", "%q is attached twice", v.VolumeID)
		}
		seen[v.VolumeID] = true
		if v.Format != "qcow2" && v.Format != "raw" {
			return invalid(f+".format", "must be qcow2 or raw, got %q", v.Format)
		}
		if v.SizeMiB < 1 {
			return invalid(f+".size_mib", "must be at least 1, got %d", v.SizeMiB)
		}
	}
	for i, c := range p.Placement.HostCPUs {
		if c < 0 {
			return invalid(fmt.Sprintf("placement.host_cpus[%d]", i), "must not be negative, got %d", c)
		}
	}
	if p.Placement.NUMANode != nil && *p.Placement.NUMANode < 0 {
		return invalid("placement.numa_node", "must not be negative, got %d", *p.Placement.NUMANode)
	}
	if len(p.Placement.GPUUUIDs) > 0 {
		return failf(vmcmd.FailUnsupported, "placement.gpu_uuids: GPU passthrough (VFIO) is not supported by this host's hypervisor")
	}
	if fs := p.FromSnapshot; fs != nil {
		if !vmcmd.ValidID(fs.InstanceID) {
			return invalid("from_snapshot.instance_id", "%q is not an instance id (1-63 of a-z, 0-9 and '-')", fs.InstanceID)
		}
		if !vmcmd.ValidID(fs.SnapshotID) {
			return invalid("from_snapshot.snapshot_id", "%q is not a snapshot id (1-63 of a-z, 0-9 and '-')", fs.SnapshotID)
		}
	}
	return nil
}

func validSnapshot(p vmcmd.SnapshotParams) error {
	if !vmcmd.ValidID(p.InstanceID) {
		return invalid("instance_id", "%q is not an instance id (1-63 of a-z, 0-9 and '-')", p.InstanceID)
	}
	if !vmcmd.ValidID(p.SnapshotID) {
		return invalid("snapshot_id", "%q is not a snapshot id (1-63 of a-z, 0-9 and '-')", p.SnapshotID)
	}
	return nil
}

func policyOf(n vmcmd.Network) string {
	if n.Policy == "" {
		return vmcmd.PolicyEgress
	}
	return n.Policy
}

func (h *Hypervisor) volumePath(id, format string) string {
	return filepath.Join(h.cfg.StateDir, dirVolumes, id+"."+format)
}

// spec maps params onto the runtime's spec. Placement the host cannot
// apply is left out and named in degraded: the instance runs, with its
// PlacementDegraded condition, rather than not at all.
func (h *Hypervisor) spec(ctx context.Context, p *vmcmd.CreateParams, img runtime.Image) (runtime.Spec, []string) {
	var degraded []string
	s := runtime.Spec{
		ID: p.InstanceID, VCPUs: p.VCPUs, MemoryMiB: p.MemoryMiB, Image: img, DiskMiB: p.DiskMiB,
		MAC:     p.Network.MAC,
		Network: &runtime.Network{Bridge: h.cfg.Bridge, BridgeAddress: h.cfg.BridgeAddress, NetNS: h.cfg.NetNS},
		Seed: &runtime.Seed{
			Hostname: p.Seed.Hostname, User: p.Seed.User, AuthorizedKeys: p.Seed.AuthorizedKeys,
			TrustedUserCAKeys: p.Seed.TrustedUserCAKeys, AuthorizedPrincipals: p.Seed.AuthorizedPrincipals,
			HostKey: p.Seed.HostKey, HostCertificate: p.Seed.HostCertificate,
			Address: p.Network.Address, Gateway: p.Network.Gateway, DNS: p.Network.DNS, UserData: p.Seed.UserData,
		},
	}
	for _, v := range p.Volumes {
		s.Volumes = append(s.Volumes, runtime.Volume{ID: v.VolumeID, Path: h.volumePath(v.VolumeID, v.Format), Format: v.Format})
	}
	if cpus := p.Placement.HostCPUs; len(cpus) > 0 {
		ok := !slices.ContainsFunc(cpus, func(c int) bool {
			return !exists(filepath.Join(h.cfg.SysfsRoot, fmt.Sprintf("sys/devices/system/cpu/cpu%d", c)))
		})
		if ok {
			s.HostCPUs = slices.Clone(cpus)
		} else {
			degraded = append(degraded, "host_cpus")
		}
	}
	if node := p.Placement.NUMANode; node != nil {
		if exists(filepath.Join(h.cfg.SysfsRoot, fmt.Sprintf("sys/devices/system/node/node%d", *node))) {
			v := *node
			s.NUMANode = &v
		} else {
			degraded = append(degraded, "numa_node")
		}
	}
	if p.Placement.HugePages {
		if h.rt.Capabilities(ctx).HugePages {
			s.HugePages = true
		} else {
			degraded = append(degraded, "huge_pages")
		}
	}
	return s, degraded
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// sameSpec compares specs as they are stored (JSON), so an adopted
// instance's spec read back from disk compares equal to a fresh one.
func sameSpec(a, b runtime.Spec) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// rule is the network policy rule of an instance.
func (h *Hypervisor) rule(s *runtime.Spec, n vmcmd.Network) vmcmd.Rule {
	addr, _ := netip.ParsePrefix(n.Address)
	return vmcmd.Rule{NetNS: h.cfg.NetNS, Bridge: h.cfg.Bridge, Tap: runtime.TapName(s), MAC: n.MAC,
		Address: addr.Addr().String(), Gateway: n.Gateway, Policy: policyOf(n), Peers: n.Peers}
}

// enforcing reports whether network policy is enforced here.
func (h *Hypervisor) enforcing() bool { return h.hasCap(vmcmd.CapNetworkPolicy) }

func (h *Hypervisor) create(ctx context.Context, p *vmcmd.CreateParams) (_ any, err error) {
	if err := validate(p); err != nil {
		return nil, err
	}
	if policyOf(p.Network) != vmcmd.PolicyEgress && !h.enforcing() {
		return nil, failf(vmcmd.FailUnsupported, "network.policy: %q needs network policy enforcement, which this host does not have (only egress)", p.Network.Policy)
	}
	img, err := h.imgs.resolve(p.Image)
	if err != nil {
		return nil, err
	}
	// The source snapshot's instance too, so a snapshot.delete cannot
	// remove the snapshot while its disk is copied (sorted: two creates
	// never wait on each other's ids in opposite orders).
	ids := []string{p.InstanceID}
	if fs := p.FromSnapshot; fs != nil && fs.InstanceID != p.InstanceID {
		ids = append(ids, fs.InstanceID)
	}
	slices.Sort(ids)
	for _, id := range ids {
		defer h.lock(id)()
	}
	// The volumes too, so a volume.delete cannot remove one between its
	// check and the instance's creation (sorted: always the same order;
	// volume commands take one volume lock and no instance lock).
	vols := make([]string, 0, len(p.Volumes))
	for _, v := range p.Volumes {
		vols = append(vols, "volume/"+v.VolumeID)
	}
	slices.Sort(vols)
	for _, v := range vols {
		defer h.lock(v)()
	}
	want, degraded := h.spec(ctx, p, img)
	// Checked before anything is made; the volumes' files are made below
	// (the runtime's Create checks them).
	probe := want
	probe.Volumes = nil
	if err := probe.Validate(); err != nil {
		return nil, runtimeErr("instance.create", err)
	}

	if have, err := h.rt.Get(ctx, p.InstanceID); err == nil {
		return h.converge(ctx, p, have, want)
	} else if !errors.Is(err, runtime.ErrNotFound) {
		return nil, runtimeErr("instance.create", err)
	}

	// The snapshot is checked before anything is made.
	if fs := p.FromSnapshot; fs != nil {
		disk, err := h.snapshotDisk(*fs, &want)
		if err != nil {
			return nil, err
		}
		want.FromDisk = disk
	}

	// From here a failure undoes what this create made. Undoing must run
	// even when ctx is what failed.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	bg := context.WithoutCancel(ctx)
	for i, v := range p.Volumes {
		made, err := h.ensureVolume(ctx, v.VolumeID, v.Format, v.SizeMiB)
		if err != nil {
			if e := (*Error)(nil); errors.As(err, &e) && e.Code == vmcmd.FailInvalid {
				return nil, invalid(fmt.Sprintf("volumes[%d]", i), "%v", e.Err)
			}
			return nil, err
		}
		if made {
			path := h.volumePath(v.VolumeID, v.Format)
			undo = append(undo, func() { _ = h.rt.DeleteVolume(bg, path) })
		}
	}
	if err := h.rt.Create(ctx, want); err != nil {
		if se := (*runtime.SpecError)(nil); errors.As(err, &se) && se.Field == "from_disk" {
			return nil, invalid("from_snapshot", "%s", se.Reason)
		}
		return nil, runtimeErr("instance.create", err)
	}
	undo = append(undo, func() { _ = h.rt.Delete(bg, want.ID) })
	m := meta{Degraded: degraded, Policy: policyOf(p.Network), Address: p.Network.Address, Tap: runtime.TapName(&want),
		BalloonFloorMiB: p.BalloonFloorMiB}
	if err := h.writeMeta(want.ID, m); err != nil {
		return nil, failf(vmcmd.FailRuntime, "instance.create: %v", err)
	}
	undo = append(undo, func() { _ = os.Remove(h.metaPath(want.ID)) })
	// The policy is in place before the guest's first packet.
	if h.enforcing() {
		if err := h.cfg.NetPolicy.Apply(ctx, h.rule(&want, p.Network)); err != nil {
			return nil, failf(vmcmd.FailRuntime, "instance.create: network policy: %v", err)
		}
		tap := m.Tap
		undo = append(undo, func() { _ = h.cfg.NetPolicy.Remove(bg, tap) })
	}
	if err := h.rt.Start(ctx, want.ID); err != nil {
		return nil, runtimeErr("instance.create: start", err)
	}
	if p.Paused {
		h.awaitBooted(ctx, want.ID)
		if err := h.rt.Pause(ctx, want.ID); err != nil {
			return nil, runtimeErr("instance.create: pause", err)
		}
	}
	if len(degraded) > 0 {
		h.log.Warn("hypervisor: placement degraded", "instance", want.ID, "not_applied", degraded)
	}
	h.log.Info("hypervisor: instance created", "instance", want.ID, "image", p.Image.Name)
	return h.status(ctx, want.ID)
}

// converge handles a create for an instance that exists: the same spec
// succeeds (a redelivery, or the control plane resending peers), a
// different one is refused. An instance created but never started (bcd
// died in between) is started; one the user stopped stays stopped.
func (h *Hypervisor) converge(ctx context.Context, p *vmcmd.CreateParams, have runtime.Info, want runtime.Spec) (any, error) {
	if !sameSpec(have.Spec, want) {
		return nil, failf(vmcmd.FailExists, "instance %q exists on this host with a different spec", p.InstanceID)
	}
	m := h.readMeta(p.InstanceID)
	if h.enforcing() {
		if err := h.cfg.NetPolicy.Apply(ctx, h.rule(&want, p.Network)); err != nil {
			return nil, failf(vmcmd.FailRuntime, "instance.create: network policy: %v", err)
		}
	}
	if m.Policy != policyOf(p.Network) {
		m.Policy = policyOf(p.Network)
		if err := h.writeMeta(p.InstanceID, m); err != nil {
			return nil, failf(vmcmd.FailRuntime, "instance.create: %v", err)
		}
	}
	if have.State == runtime.StateCreated {
		if err := h.rt.Start(ctx, p.InstanceID); err != nil {
			return nil, runtimeErr("instance.create: start", err)
		}
		if p.Paused {
			h.awaitBooted(ctx, p.InstanceID)
			if err := h.rt.Pause(ctx, p.InstanceID); err != nil {
				return nil, runtimeErr("instance.create: pause", err)
			}
		}
	}
	return h.status(ctx, p.InstanceID)
}

// peers re-applies a private instance's network policy with a new peer
// list; the guest and its spec are untouched. The rule's other fields come
// from what create recorded (the runtime's spec and the metadata).
func (h *Hypervisor) peers(ctx context.Context, p vmcmd.PeersParams) (any, error) {
	if !vmcmd.ValidID(p.InstanceID) {
		return nil, invalid("instance_id", "%q is not an instance id (1-63 of a-z, 0-9 and '-')", p.InstanceID)
	}
	for i, peer := range p.Peers {
		if _, err := netip.ParseAddr(peer); err != nil {
			return nil, invalid(fmt.Sprintf("peers[%d]", i), "%q is not an IP address", peer)
		}
	}
	unlock := h.lock(p.InstanceID)
	defer unlock()
	have, err := h.rt.Get(ctx, p.InstanceID)
	if err != nil {
		return nil, runtimeErr("instance.peers", err)
	}
	m := h.readMeta(p.InstanceID)
	// Only private admits by peers; egress and none do not read them.
	if m.Policy == vmcmd.PolicyPrivate && h.enforcing() {
		n := vmcmd.Network{MAC: have.Spec.MAC, Address: m.Address, Policy: m.Policy, Peers: p.Peers}
		if sd := have.Spec.Seed; sd != nil {
			n.Gateway = sd.Gateway
			if n.Address == "" {
				n.Address = sd.Address
			}
		}
		if err := h.cfg.NetPolicy.Apply(ctx, h.rule(&have.Spec, n)); err != nil {
			return nil, failf(vmcmd.FailRuntime, "instance.peers: network policy: %v", err)
		}
	}
	return h.status(ctx, p.InstanceID)
}

// snapshotDisk is the disk a create from fs copies: the snapshot must be
// on this host, of the image want boots (its disk is an overlay on that
// image's rootfs) and no larger than want's disk.
func (h *Hypervisor) snapshotDisk(fs vmcmd.SnapshotParams, want *runtime.Spec) (string, error) {
	dir := h.snapshotDir(fs)
	b, err := os.ReadFile(filepath.Join(dir, fileSnapshotSpec))
	if errors.Is(err, os.ErrNotExist) {
		return "", failf(vmcmd.FailNotFound, "instance.create: from_snapshot: instance %q has no snapshot %q on this host", fs.InstanceID, fs.SnapshotID)
	}
	if err != nil {
		return "", failf(vmcmd.FailRuntime, "instance.create: from_snapshot: %v", err)
	}
	var snap runtime.Spec
	if err := json.Unmarshal(b, &snap); err != nil {
		return "", failf(vmcmd.FailRuntime, "instance.create: from_snapshot: snapshot %q of %q: unreadable spec: %v", fs.SnapshotID, fs.InstanceID, err)
	}
	if snap.Image.Disk != want.Image.Disk {
		return "", invalid("from_snapshot", "snapshot %q of %q is of the image disk %s, not %s (this instance's image)",
			fs.SnapshotID, fs.InstanceID, snap.Image.Disk, want.Image.Disk)
	}
	if snap.DiskMiB > want.DiskMiB {
		return "", invalid("from_snapshot", "snapshot %q of %q has a %d MiB disk, larger than disk_mib (%d)",
			fs.SnapshotID, fs.InstanceID, snap.DiskMiB, want.DiskMiB)
	}
	disk := filepath.Join(dir, fileSnapshotDisk)
	if !exists(disk) {
		return "", failf(vmcmd.FailRuntime, "instance.create: from_snapshot: snapshot %q of %q is incomplete: no %s", fs.SnapshotID, fs.InstanceID, fileSnapshotDisk)
	}
	return disk, nil
}

// delete converges on "gone": no QEMU, tap, overlay, seed, metadata,
// snapshots or policy rules, whether or not the runtime knew the
// instance. The snapshots p keeps stay in the store (snapshot.delete
// removes them).
func (h *Hypervisor) delete(ctx context.Context, p vmcmd.DeleteParams) (any, error) {
	id := p.InstanceID
	unlock := h.lock(id)
	defer unlock()
	m := h.readMeta(id)
	if err := h.rt.Delete(ctx, id); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		return nil, runtimeErr("instance.delete", err)
	}
	if h.cfg.NetPolicy != nil {
		tap := m.Tap
		if tap == "" {
			tap = runtime.TapName(&runtime.Spec{ID: id})
		}
		if err := h.cfg.NetPolicy.Remove(ctx, tap); err != nil {
			return nil, failf(vmcmd.FailRuntime, "instance.delete: network policy: %v", err)
		}
	}
	if err := h.removeSnapshots(id, p.KeepSnapshots); err != nil {
		return nil, failf(vmcmd.FailRuntime, "instance.delete: snapshots: %v", err)
	}
	if err := os.Remove(h.metaPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, failf(vmcmd.FailRuntime, "instance.delete: %v", err)
	}
	return vmcmd.Status{InstanceID: id, State: vmcmd.StateDeleted}, nil
}

// power is start, stop, reboot, pause and resume; each converges (stop
// of a stopped instance succeeds).
func (h *Hypervisor) power(ctx context.Context, kind, id string) (any, error) {
	unlock := h.lock(id)
	defer unlock()
	info, err := h.rt.Get(ctx, id)
	if err != nil {
		return nil, runtimeErr(kind, err)
	}
	switch kind {
	case vmcmd.KindInstanceStart:
		switch info.State {
		case runtime.StatePaused:
			err = h.rt.Resume(ctx, id)
		case runtime.StateRunning:
		default:
			err = h.rt.Start(ctx, id)
		}
	case vmcmd.KindInstanceStop:
		err = h.rt.Stop(ctx, id)
	case vmcmd.KindInstanceReboot:
		err = h.rt.Reboot(ctx, id)
	case vmcmd.KindInstancePause:
		if info.State != runtime.StatePaused {
			err = h.rt.Pause(ctx, id)
		}
	case vmcmd.KindInstanceResume:
		if info.State != runtime.StateRunning {
			err = h.rt.Resume(ctx, id)
		}
	}
	if err != nil {
		return nil, runtimeErr(kind, err)
	}
	return h.status(ctx, id)
}

// removeSnapshots removes an instance's snapshots but the kept ones, and
// its snapshot directory once it holds none.
func (h *Hypervisor) removeSnapshots(id string, keep []string) error {
	dir := filepath.Join(h.cfg.StateDir, dirSnapshots, id)
	if len(keep) == 0 {
		return os.RemoveAll(dir)
	}
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
	return removeIfEmpty(dir)
}

// removeIfEmpty removes dir when it has no entries (a missing one is
// fine).
func removeIfEmpty(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil || len(entries) > 0 {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// snapshotDelete removes one snapshot from the store, whether or not its
// instance still exists; a missing one succeeds.
func (h *Hypervisor) snapshotDelete(p vmcmd.SnapshotParams) (any, error) {
	unlock := h.lock(p.InstanceID)
	defer unlock()
	if err := os.RemoveAll(h.snapshotDir(p)); err != nil {
		return nil, failf(vmcmd.FailRuntime, "snapshot.delete: %v", err)
	}
	if err := removeIfEmpty(filepath.Dir(h.snapshotDir(p))); err != nil {
		return nil, failf(vmcmd.FailRuntime, "snapshot.delete: %v", err)
	}
	h.log.Info("hypervisor: snapshot deleted", "instance", p.InstanceID, "snapshot", p.SnapshotID)
	return vmcmd.SnapshotDeleted(p), nil
}

func (h *Hypervisor) snapshotDir(p vmcmd.SnapshotParams) string {
	return filepath.Join(h.cfg.StateDir, dirSnapshots, p.InstanceID, p.SnapshotID)
}

// snapshot is idempotent: a snapshot id already taken succeeds as it is.
func (h *Hypervisor) snapshot(ctx context.Context, p vmcmd.SnapshotParams) (any, error) {
	unlock := h.lock(p.InstanceID)
	defer unlock()
	if _, err := h.rt.Get(ctx, p.InstanceID); err != nil {
		return nil, runtimeErr("instance.snapshot", err)
	}
	dir := h.snapshotDir(p)
	if exists(filepath.Join(dir, fileSnapshotSpec)) {
		return h.status(ctx, p.InstanceID)
	}
	// A snapshot that died half-way is taken again.
	if err := os.RemoveAll(dir); err != nil {
		return nil, failf(vmcmd.FailRuntime, "instance.snapshot: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, failf(vmcmd.FailRuntime, "instance.snapshot: %v", err)
	}
	if err := h.rt.Snapshot(ctx, p.InstanceID, dir); err != nil {
		return nil, runtimeErr("instance.snapshot", err)
	}
	return h.status(ctx, p.InstanceID)
}

func (h *Hypervisor) restore(ctx context.Context, p vmcmd.SnapshotParams) (any, error) {
	unlock := h.lock(p.InstanceID)
	defer unlock()
	if _, err := h.rt.Get(ctx, p.InstanceID); err != nil {
		return nil, runtimeErr("instance.restore", err)
	}
	dir := h.snapshotDir(p)
	if !exists(filepath.Join(dir, fileSnapshotSpec)) {
		return nil, failf(vmcmd.FailNotFound, "instance.restore: instance %q has no snapshot %q on this host", p.InstanceID, p.SnapshotID)
	}
	if err := h.rt.Restore(ctx, p.InstanceID, dir); err != nil {
		return nil, runtimeErr("instance.restore", err)
	}
	return h.status(ctx, p.InstanceID)
}

func (h *Hypervisor) list(ctx context.Context) vmcmd.ListResult {
	res := vmcmd.ListResult{Instances: []vmcmd.Status{}}
	for _, in := range h.rt.List(ctx) {
		res.Instances = append(res.Instances, h.statusOf(in))
	}
	return res
}

func (h *Hypervisor) status(ctx context.Context, id string) (vmcmd.Status, error) {
	in, err := h.rt.Get(ctx, id)
	if err != nil {
		return vmcmd.Status{}, runtimeErr("status", err)
	}
	return h.statusOf(in), nil
}

func (h *Hypervisor) statusOf(in runtime.Info) vmcmd.Status {
	st := vmcmd.Status{InstanceID: in.ID, Accel: in.Accel}
	switch in.State {
	case runtime.StateRunning:
		st.State = vmcmd.StateRunning
	case runtime.StatePaused:
		st.State = vmcmd.StatePaused
	default:
		st.State = vmcmd.StateStopped
	}
	if in.Spec.Network != nil {
		st.Tap = runtime.TapName(&in.Spec)
	}
	m := h.readMeta(in.ID)
	st.Degraded = m.Degraded
	addr := m.Address
	if addr == "" && in.Spec.Seed != nil {
		addr = in.Spec.Seed.Address
	}
	if p, err := netip.ParsePrefix(addr); err == nil {
		st.SSHAddress = netip.AddrPortFrom(p.Addr(), 22).String()
	}
	return st
}

// ensureVolume creates a volume file unless it exists (volume.create and
// instance.create are both level-triggered); made says whether this call
// made it. The same id in the other format is refused.
func (h *Hypervisor) ensureVolume(ctx context.Context, id, format string, sizeMiB int) (made bool, err error) {
	path := h.volumePath(id, format)
	other := map[string]string{"qcow2": "raw", "raw": "qcow2"}[format]
	if exists(h.volumePath(id, other)) {
		return false, failf(vmcmd.FailExists, "volume %q exists on this host as %s, not %s", id, other, format)
	}
	if exists(path) {
		return false, nil
	}
	if err := h.rt.CreateVolume(ctx, path, format, sizeMiB); err != nil {
		return false, runtimeErr("volume.create", err)
	}
	return true, nil
}

func validVolume(p vmcmd.VolumeParams, sized bool) error {
	if !vmcmd.ValidID(p.VolumeID) {
		return invalid("volume_id", "%q is not a volume id (1-63 of a-z, 0-9 and '-')", p.VolumeID)
	}
	if sized || p.Format != "" {
		if p.Format != "qcow2" && p.Format != "raw" {
			return invalid("format", "must be qcow2 or raw, got %q", p.Format)
		}
	}
	if sized && p.SizeMiB < 1 {
		return invalid("size_mib", "must be at least 1, got %d", p.SizeMiB)
	}
	return nil
}

func (h *Hypervisor) volumeCreate(ctx context.Context, p vmcmd.VolumeParams) (any, error) {
	if err := validVolume(p, true); err != nil {
		return nil, err
	}
	unlock := h.lock("volume/" + p.VolumeID)
	defer unlock()
	if _, err := h.ensureVolume(ctx, p.VolumeID, p.Format, p.SizeMiB); err != nil {
		return nil, err
	}
	return p, nil
}

// volumeDelete removes the volume in whichever format it has; a missing
// one succeeds, an attached one is busy.
func (h *Hypervisor) volumeDelete(ctx context.Context, p vmcmd.VolumeParams) (any, error) {
	if err := validVolume(p, false); err != nil {
		return nil, err
	}
	unlock := h.lock("volume/" + p.VolumeID)
	defer unlock()
	for _, format := range []string{"qcow2", "raw"} {
		path := h.volumePath(p.VolumeID, format)
		if !exists(path) {
			continue
		}
		for _, in := range h.rt.List(ctx) {
			if slices.ContainsFunc(in.Spec.Volumes, func(v runtime.Volume) bool { return v.Path == path }) {
				return nil, failf(vmcmd.FailBusy, "volume %q is attached to instance %q", p.VolumeID, in.ID)
			}
		}
		if err := h.rt.DeleteVolume(ctx, path); err != nil {
			return nil, runtimeErr("volume.delete", err)
		}
	}
	return vmcmd.VolumeParams{VolumeID: p.VolumeID}, nil
}

func validAttach(p vmcmd.AttachParams, formatted bool) error {
	if !vmcmd.ValidID(p.InstanceID) {
		return invalid("instance_id", "%q is not an instance id (1-63 of a-z, 0-9 and '-')", p.InstanceID)
	}
	if !vmcmd.ValidID(p.VolumeID) {
		return invalid("volume_id", "%q is not a volume id (1-63 of a-z, 0-9 and '-')", p.VolumeID)
	}
	if formatted || p.Format != "" {
		if p.Format != "qcow2" && p.Format != "raw" {
			return invalid("format", "must be qcow2 or raw, got %q", p.Format)
		}
	}
	return nil
}

// volumeAttach hot-plugs a volume into a running (or paused) guest, or
// adds it to a stopped one's spec for its next start. An attached volume
// succeeds as it is; one attached to another instance is busy.
func (h *Hypervisor) volumeAttach(ctx context.Context, p vmcmd.AttachParams) (any, error) {
	if err := validAttach(p, true); err != nil {
		return nil, err
	}
	// Instance first, then volume: the order create takes them in.
	unlock := h.lock(p.InstanceID)
	defer unlock()
	defer h.lock("volume/" + p.VolumeID)()
	info, err := h.rt.Get(ctx, p.InstanceID)
	if err != nil {
		return nil, runtimeErr("volume.attach", err)
	}
	path := h.volumePath(p.VolumeID, p.Format)
	if i := slices.IndexFunc(info.Spec.Volumes, func(v runtime.Volume) bool { return v.ID == p.VolumeID }); i >= 0 {
		if info.Spec.Volumes[i].Path != path {
			return nil, failf(vmcmd.FailExists, "volume %q is attached to instance %q as %s", p.VolumeID, p.InstanceID, info.Spec.Volumes[i].Format)
		}
		return h.status(ctx, p.InstanceID)
	}
	if !exists(path) {
		return nil, failf(vmcmd.FailNotFound, "volume %q (%s) is not on this host", p.VolumeID, p.Format)
	}
	for _, in := range h.rt.List(ctx) {
		if slices.ContainsFunc(in.Spec.Volumes, func(v runtime.Volume) bool { return v.Path == path }) {
			return nil, failf(vmcmd.FailBusy, "volume %q is attached to instance %q", p.VolumeID, in.ID)
		}
	}
	if err := h.rt.AttachVolume(ctx, p.InstanceID, runtime.Volume{ID: p.VolumeID, Path: path, Format: p.Format}); err != nil {
		return nil, runtimeErr("volume.attach", err)
	}
	h.log.Info("hypervisor: volume attached", "instance", p.InstanceID, "volume", p.VolumeID, "running", info.State == runtime.StateRunning)
	return h.status(ctx, p.InstanceID)
}

// volumeDetach takes a volume off an instance: a running guest must
// release the device within DetachWait (else busy, and the volume stays
// attached); a stopped one just loses it from its spec. A volume the
// instance does not hold succeeds.
func (h *Hypervisor) volumeDetach(ctx context.Context, p vmcmd.AttachParams) (any, error) {
	if err := validAttach(p, false); err != nil {
		return nil, err
	}
	unlock := h.lock(p.InstanceID)
	defer unlock()
	defer h.lock("volume/" + p.VolumeID)()
	info, err := h.rt.Get(ctx, p.InstanceID)
	if err != nil {
		return nil, runtimeErr("volume.detach", err)
	}
	if !slices.ContainsFunc(info.Spec.Volumes, func(v runtime.Volume) bool { return v.ID == p.VolumeID }) {
		return h.status(ctx, p.InstanceID)
	}
	wait := h.cfg.DetachWait
	if wait <= 0 {
		wait = time.Minute
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := h.rt.DetachVolume(wctx, p.InstanceID, p.VolumeID); err != nil {
		// Our own bound ran out, not the command's: the guest holds on to
		// the disk (mounted, or no hot-unplug support).
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, failf(vmcmd.FailBusy, "volume.detach: the guest did not release volume %q within %s (unmount it first): %v", p.VolumeID, wait, err)
		}
		return nil, runtimeErr("volume.detach", err)
	}
	h.log.Info("hypervisor: volume detached", "instance", p.InstanceID, "volume", p.VolumeID)
	return h.status(ctx, p.InstanceID)
}
