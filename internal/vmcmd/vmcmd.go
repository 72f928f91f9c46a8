// Package vmcmd is the wire contract between the control plane's instance
// and volume services (internal/vps) and bcd's hypervisor side
// (internal/agent): the command kinds, the JSON form of their params (in
// agentv1.Command.params) and of their results (in CommandUpdate.result),
// and the failure codes. Both sides import it so the contract is written
// once; it holds no logic beyond validation of its own shapes.
package vmcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
)

// Command kinds. Every instance command names the instance by its id; a
// command for an instance bcd does not have fails with FailNotFound, except
// delete, which succeeds (deletes are retried and must converge).
const (
	// KindInstanceCreate creates the instance's disks, seed, tap and
	// network policy and boots it. Params: CreateParams; result: Status.
	// Creating an instance that exists with the same spec succeeds with
	// its status (the command may be redelivered).
	KindInstanceCreate = "instance.create"
	// KindInstanceStart, Stop, Reboot, Pause, Resume and Delete take
	// InstanceRef and answer Status (delete answers State "deleted").
	KindInstanceStart  = "instance.start"
	KindInstanceStop   = "instance.stop"
	KindInstanceReboot = "instance.reboot"
	KindInstancePause  = "instance.pause"
	KindInstanceResume = "instance.resume"
	KindInstanceDelete = "instance.delete"
	// KindInstanceSnapshot saves memory, device state and disks into the
	// host's snapshot store under SnapshotParams.SnapshotID; Restore
	// replaces the instance's state with one taken on this host.
	KindInstanceSnapshot = "instance.snapshot"
	KindInstanceRestore  = "instance.restore"
	// KindSnapshotDelete removes one snapshot (SnapshotParams) from the
	// host's snapshot store, whether or not its instance still exists (a
	// kept snapshot outlives it: DeleteParams.KeepSnapshots). A missing
	// snapshot succeeds. Result: SnapshotDeleted.
	KindSnapshotDelete = "snapshot.delete"
	// KindInstanceList reports every instance bcd runs (ListResult), so
	// the control plane converges (lost instances, strays).
	KindInstanceList = "instance.list"
	// KindInstancePeers replaces a private instance's peers (PeersParams)
	// in its network policy, as the tenant's instances on its network come
	// and go; the guest is not touched. Result: Status. An instance whose
	// policy is not private succeeds unchanged (peers are what private
	// admits).
	KindInstancePeers = "instance.peers"
	// KindVolumeCreate creates a host volume file (VolumeParams); Delete
	// removes it (a missing one succeeds). A volume attached to an
	// existing instance cannot be deleted (FailBusy).
	KindVolumeCreate = "volume.create"
	KindVolumeDelete = "volume.delete"
	// KindVolumeAttach hot-plugs a host volume into an instance
	// (AttachParams): a running guest gets a new virtio disk at once, a
	// stopped one at its next start. Attaching an attached volume
	// succeeds. Result: Status.
	KindVolumeAttach = "volume.attach"
	// KindVolumeDetach takes a volume off an instance (AttachParams); a
	// running guest must release the device before the command's
	// deadline (FailBusy otherwise). Detaching a detached volume
	// succeeds. Result: Status.
	KindVolumeDetach = "volume.detach"
	// KindInstanceTunnel asks bcd to dial the guest's sshd and carry the
	// connection on a new AgentService.Tunnel stream named
	// TunnelParams.TunnelID. It succeeds once the stream is open (the
	// bytes flow after the command ends); a guest bcd cannot reach fails
	// it, and the stream's first frame says why.
	KindInstanceTunnel = "instance.tunnel"
)

// Kinds is every kind of this contract, for the gateway's allow list and
// capability checks.
var Kinds = []string{KindInstanceCreate, KindInstanceStart, KindInstanceStop, KindInstanceReboot, KindInstancePause,
	KindInstanceResume, KindInstanceDelete, KindInstanceSnapshot, KindInstanceRestore, KindSnapshotDelete, KindInstanceList,
	KindInstancePeers, KindVolumeCreate, KindVolumeDelete, KindVolumeAttach, KindVolumeDetach, KindInstanceTunnel}

// Capabilities bcd advertises only where it enforces them (DESIGN §7).
const (
	// CapInstances: bcd runs instances (a runtime is configured).
	CapInstances = "instance.run"
	// CapPlacement: pinned CPUs, NUMA binding and hugepages are applied.
	CapPlacement = "instance.placement"
	// CapVolumes: host volumes can be created and attached, also to a
	// running guest (volume.attach, volume.detach).
	CapVolumes = "instance.volumes"
	// CapNetworkPolicy: egress/private/none are enforced with nftables.
	CapNetworkPolicy = "instance.network-policy"
	// CapSnapshot: snapshot and restore work on this host.
	CapSnapshot = "instance.snapshot"
)

// Failure codes (CommandUpdate.failure_code).
const (
	FailInvalid     = "INSTANCE_INVALID"       // the params are refused; the message names the field
	FailNotFound    = "INSTANCE_NOT_FOUND"     // no such instance (or volume, or snapshot)
	FailExists      = "INSTANCE_EXISTS"        // create with a different spec for an existing id
	FailImage       = "INSTANCE_IMAGE"         // the guest image is not on this host or its digest differs
	FailUnsupported = "INSTANCE_UNSUPPORTED"   // a capability this host does not enforce was asked for
	FailBusy        = "INSTANCE_BUSY"          // e.g. deleting an attached volume
	FailRuntime     = "INSTANCE_RUNTIME"       // QEMU or the host failed; the message carries its output
	FailNoRuntime   = "INSTANCE_NO_HYPERVISOR" // this bcd runs no instances
)

// Network policies (DESIGN §7; issue: egress is the default).
const (
	PolicyEgress  = "egress"  // the guest reaches anything; inbound only from its tenant's guests and the host
	PolicyPrivate = "private" // only the tenant's guests on the same host network (and DHCP/DNS to the gateway)
	PolicyNone    = "none"    // no traffic at all besides the host's SSH exec path
)

// InstanceRef names one instance.
type InstanceRef struct {
	InstanceID string `json:"instance_id"`
}

// DeleteParams is instance.delete: an InstanceRef that may name snapshots
// to keep. The instance's other snapshots go with it; the kept ones stay
// in the host's snapshot store under the instance's id until
// snapshot.delete, and can seed new instances (CreateParams.FromSnapshot).
type DeleteParams struct {
	InstanceID    string   `json:"instance_id"`
	KeepSnapshots []string `json:"keep_snapshots,omitempty"`
}

// Image is the guest image an instance boots. bcd resolves it from its
// guest image directory (--guest-images DIR: DIR/NAME/{rootfs.qcow2,
// vmlinuz, initrd.img, cmdline, SHA256SUMS}, as make guest-image writes
// it); Sha256, when set, must be rootfs.qcow2's.
type Image struct {
	Name   string `json:"name"`
	Sha256 string `json:"sha256,omitempty"`
}

// Network is the guest's one NIC and what IPAM gave it.
type Network struct {
	// MAC is the guest NIC's address (the control plane derives it from
	// the instance id, so redelivery gives the same one).
	MAC string `json:"mac"`
	// Address is the lease with the pool's prefix length (10.0.0.5/24).
	Address string   `json:"address"`
	Gateway string   `json:"gateway"`
	DNS     []string `json:"dns,omitempty"`
	// Policy is egress, private or none.
	Policy string `json:"policy"`
	// Peers are the addresses of the same tenant's instances on this
	// host network: what private admits. The control plane sends later
	// lists as instance.peers as instances come and go.
	Peers []string `json:"peers,omitempty"`
}

// VolumeRef is a host volume attached to an instance.
type VolumeRef struct {
	VolumeID string `json:"volume_id"`
	Format   string `json:"format"` // qcow2 or raw
	SizeMiB  int    `json:"size_mib"`
}

// Placement is what capacity booked on the host for this instance.
type Placement struct {
	// HostCPUs are the dedicated CPUs of a pinned flavor (empty: shared).
	HostCPUs []int `json:"host_cpus,omitempty"`
	// NUMANode binds memory (nil: any).
	NUMANode *int `json:"numa_node,omitempty"`
	// HugePages backs memory with hugepages.
	HugePages bool `json:"huge_pages,omitempty"`
	// GPUUUIDs are GPUs passed through (VFIO), where the host supports it.
	GPUUUIDs []string `json:"gpu_uuids,omitempty"`
}

// Seed is the guest's cloud-init data.
type Seed struct {
	Hostname string `json:"hostname"`
	// User is the login account.
	User              string   `json:"user"`
	AuthorizedKeys    []string `json:"authorized_keys,omitempty"`
	TrustedUserCAKeys []string `json:"trusted_user_ca_keys,omitempty"`
	// AuthorizedPrincipals are the only certificate principals that log in
	// as User (sshd's AuthorizedPrincipalsFile): the instance's own id, so
	// a certificate signed for one instance opens no other guest although
	// every guest trusts the same CA. Required with TrustedUserCAKeys.
	AuthorizedPrincipals []string `json:"authorized_principals,omitempty"`
	// HostKey (OpenSSH PEM) and HostCertificate (CA-signed) let clients
	// pin the guest. HostKey is secret: it travels only in the command
	// (over mTLS) and in the guest's seed, never in results or logs.
	HostKey         string `json:"host_key,omitempty"`
	HostCertificate string `json:"host_certificate,omitempty"`
	// UserData is the tenant's user data; secrets in it never appear in
	// results, events or logs.
	UserData string `json:"user_data,omitempty"`
}

// CreateParams is instance.create.
type CreateParams struct {
	InstanceID string      `json:"instance_id"`
	VCPUs      int         `json:"vcpus"`
	MemoryMiB  int         `json:"memory_mib"`
	DiskMiB    int         `json:"disk_mib"`
	Image      Image       `json:"image"`
	Network    Network     `json:"network"`
	Volumes    []VolumeRef `json:"volumes,omitempty"`
	Placement  Placement   `json:"placement"`
	Seed       Seed        `json:"seed"`
	// Paused leaves the guest paused once booted (a warm sandbox).
	Paused bool `json:"paused,omitempty"`
	// BalloonFloorMiB lets the host's balloon controller take the guest's
	// memory back down to this many MiB under memory pressure (a flavor
	// with balloon in a pool that overcommits memory); 0: the guest's
	// memory is never ballooned. At most MemoryMiB.
	BalloonFloorMiB int `json:"balloon_floor_mib,omitempty"`
	// FromSnapshot seeds the new instance's disk with the disk of a
	// snapshot in this host's store (of another instance, live or
	// deleted): the guest boots cold from that disk state with its own
	// fresh identity (its seed's instance id, hostname, address and host
	// key; cloud-init re-runs its first-boot modules for a new instance
	// id). The snapshot must be of the same image and its disk no larger
	// than DiskMiB (FailInvalid otherwise); a missing one fails
	// FailNotFound. The snapshot's memory and its volumes are not used.
	FromSnapshot *SnapshotParams `json:"from_snapshot,omitempty"`
}

// PeersParams is instance.peers: the whole peer list, replacing the
// previous one (bcd runs an instance's commands in order, so the latest
// list wins and a redelivery converges).
type PeersParams struct {
	InstanceID string   `json:"instance_id"`
	Peers      []string `json:"peers"`
}

// SnapshotParams is instance.snapshot and instance.restore.
type SnapshotParams struct {
	InstanceID string `json:"instance_id"`
	SnapshotID string `json:"snapshot_id"`
}

// SnapshotDeleted is snapshot.delete's result.
type SnapshotDeleted struct {
	InstanceID string `json:"instance_id"`
	SnapshotID string `json:"snapshot_id"`
}

// TunnelParams is instance.tunnel.
type TunnelParams struct {
	InstanceID string `json:"instance_id"`
	TunnelID   string `json:"tunnel_id"`
}

// TunnelResult is instance.tunnel's result.
type TunnelResult struct {
	TunnelID string `json:"tunnel_id"`
}

// GuestDialer is what a hypervisor offers the tunnel path: a connection to
// an instance's sshd, from wherever the guest is reachable (inside the
// instance network's namespace). A missing instance fails with
// FailNotFound; one not running with FailRuntime.
type GuestDialer interface {
	DialGuest(ctx context.Context, instanceID string) (net.Conn, error)
}

// VolumeParams is volume.create and volume.delete.
type VolumeParams struct {
	VolumeID string `json:"volume_id"`
	Format   string `json:"format"`
	SizeMiB  int    `json:"size_mib"`
}

// AttachParams is volume.attach and volume.detach: one host volume and the
// instance it goes into (or comes out of). Format says which file the
// volume is (qcow2 or raw); detach needs only the ids.
type AttachParams struct {
	InstanceID string `json:"instance_id"`
	VolumeID   string `json:"volume_id"`
	Format     string `json:"format,omitempty"`
}

// Instance states bcd reports.
const (
	StateRunning = "running"
	StatePaused  = "paused"
	StateStopped = "stopped"
	StateDeleted = "deleted"
)

// Status is one instance as bcd sees it.
type Status struct {
	InstanceID string `json:"instance_id"`
	State      string `json:"state"`
	// Accel is kvm or tcg: what this guest really runs on.
	Accel string `json:"accel,omitempty"`
	Tap   string `json:"tap,omitempty"`
	// Degraded lists placement asks the host could not apply (e.g.
	// "huge_pages"), for the instance's PlacementDegraded condition.
	Degraded []string `json:"degraded,omitempty"`
	// SSHAddress is where the control plane's exec path reaches the
	// guest's sshd (host:port, or the guest address on the host network).
	SSHAddress string `json:"ssh_address,omitempty"`
}

// ListResult is instance.list.
type ListResult struct {
	Instances []Status `json:"instances"`
}

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidID reports whether s can name an instance, volume or snapshot on a
// host (it becomes a directory and part of device names).
func ValidID(s string) bool { return idRE.MatchString(s) }

// Decode reads params (a command's Struct as JSON) into v, refusing
// unknown fields so a newer control plane's ask is not half-applied.
func Decode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("vmcmd: %w", err)
	}
	return nil
}

// NetPolicy enforces an instance's network policy on its tap device
// (internal/agent/netpolicy implements it with nftables). Apply is
// idempotent and replaces the tap's rules; Remove of a tap without rules
// succeeds.
type NetPolicy interface {
	// Supported reports whether policies are enforced on this host.
	Supported(ctx context.Context) bool
	Apply(ctx context.Context, r Rule) error
	Remove(ctx context.Context, tap string) error
}

// Rule is one tap's policy.
type Rule struct {
	// NetNS is the network namespace holding the bridge and tap (empty:
	// the host's).
	NetNS   string   `json:"netns,omitempty"`
	Bridge  string   `json:"bridge"`
	Tap     string   `json:"tap"`
	MAC     string   `json:"mac"`
	Address string   `json:"address"` // the guest's, without prefix
	Gateway string   `json:"gateway"`
	Policy  string   `json:"policy"`
	Peers   []string `json:"peers,omitempty"`
}
