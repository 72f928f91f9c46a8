// Package hypervisor is bcd's side of the instance commands (internal/vmcmd):
// it turns instance.* and volume.* commands into runtime operations on this
// host — resolving the guest image, creating volumes, mapping placement
// and network onto the runtime's spec, applying network policy through
// vmcmd.NetPolicy — and re-adopts the guests a previous bcd left running.
//
// It owns one state directory: instances/ (the runtime's), volumes/,
// snapshots/INSTANCE/SNAPSHOT and meta/INSTANCE.json (what the runtime's
// spec does not hold: degraded placement, policy). Every operation on one
// instance is serialised; a failed create leaves nothing behind.
package hypervisor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/better-compute/better-compute/internal/agent/runtime"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// Runtime is what the hypervisor needs of internal/agent/runtime; tests
// give it a fake.
type Runtime interface {
	Create(ctx context.Context, spec runtime.Spec) error
	Start(ctx context.Context, id string) error
	Stop(ctx context.Context, id string) error
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	Reboot(ctx context.Context, id string) error
	Delete(ctx context.Context, id string) error
	Snapshot(ctx context.Context, id, dir string) error
	Restore(ctx context.Context, id, dir string) error
	Get(ctx context.Context, id string) (runtime.Info, error)
	List(ctx context.Context) []runtime.Info
	Adopt(ctx context.Context) ([]runtime.Info, error)
	CreateVolume(ctx context.Context, path, format string, sizeMiB int) error
	DeleteVolume(ctx context.Context, path string) error
	AttachVolume(ctx context.Context, id string, v runtime.Volume) error
	DetachVolume(ctx context.Context, id, volumeID string) error
	Capabilities(ctx context.Context) runtime.Capabilities
}

var _ Runtime = (*runtime.Runtime)(nil)

// Config configures a Hypervisor.
type Config struct {
	// StateDir holds instances, volumes, snapshots and metadata. Required
	// (absolute).
	StateDir string
	// Images is the guest image directory: Images/NAME is one image as
	// `make guest-image` (tools/guest-image/build.sh) writes it. Required.
	Images string
	// Bridge is the per-host bridge guests' taps join (default bcbr0);
	// created when missing, with BridgeAddress (CIDR, typically the
	// guests' gateway) when set.
	Bridge        string
	BridgeAddress string
	// NetNS, when set, is a named network namespace holding the bridge and
	// taps (tests; a host that keeps guests off its own network stack).
	NetNS string
	// SysfsRoot is where /sys is read to check placement (default "/").
	SysfsRoot string
	// NetPolicy enforces egress/private/none; nil means only egress (no
	// filtering) is accepted and CapNetworkPolicy is not advertised.
	NetPolicy vmcmd.NetPolicy
	// Runtime runs the guests; nil builds a runtime.Runtime over
	// StateDir/instances with Accel and StopTimeout.
	Runtime     Runtime
	Accel       string
	StopTimeout time.Duration
	// WarmReady bounds how long a create asking for a paused guest (a
	// warm sandbox) lets it boot until its sshd answers before pausing it,
	// so that claiming it later costs a resume, not a boot (0: 10 minutes;
	// negative: pause at once, as a host without guest networking must).
	WarmReady time.Duration
	// DetachWait bounds how long volume.detach waits for a running guest
	// to release the device (0: 1 minute); a guest that does not is
	// FailBusy and keeps the volume.
	DetachWait time.Duration
	Logger     *slog.Logger
	// MemInfo reads the host's free memory for the balloon controller
	// (nil: /proc/meminfo). BalloonLowPercent, BalloonHighPercent and
	// BalloonInterval are its water marks and period (BalloonConfig).
	MemInfo            MemInfo
	BalloonLowPercent  int
	BalloonHighPercent int
	BalloonInterval    time.Duration
}

var ifNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,14}$`)

// Error is a command failure with its vmcmd failure code.
type Error struct {
	Code string
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// FailureCode is the command's failure code (CommandUpdate.failure_code).
func (e *Error) FailureCode() string { return e.Code }

func failf(code, format string, a ...any) error {
	return &Error{Code: code, Err: fmt.Errorf(format, a...)}
}

// invalid is a refused field.
func invalid(field, format string, a ...any) error {
	return &Error{Code: vmcmd.FailInvalid, Err: fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...))}
}

// Hypervisor applies vmcmd commands on this host.
type Hypervisor struct {
	cfg  Config
	rt   Runtime
	log  *slog.Logger
	imgs *images

	mu    sync.Mutex
	locks map[string]*sync.Mutex
	caps  []string
	// dial reaches a guest's sshd address (tests only; nil: TCP, inside
	// NetNS when set).
	dial func(ctx context.Context, addr string) (net.Conn, error)
	// balloons is nil where the runtime cannot move balloons (a test's
	// fake runtime).
	balloons *BalloonController
}

// Directories under StateDir.
const (
	dirInstances = "instances"
	dirVolumes   = "volumes"
	dirSnapshots = "snapshots"
	dirMeta      = "meta"
)

// Files of a snapshot directory that the hypervisor reads (the runtime
// writes them: internal/agent/runtime/snapshot.go).
const (
	fileSnapshotSpec = "spec.json"
	fileSnapshotDisk = "disk.qcow2"
)

// New checks cfg and prepares the state directory; call Start before
// Apply.
func New(cfg Config) (*Hypervisor, error) {
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return nil, errors.New("hypervisor: state dir must be an absolute path")
	}
	if cfg.Images == "" || !filepath.IsAbs(cfg.Images) {
		return nil, errors.New("hypervisor: guest image directory must be an absolute path")
	}
	cfg.Bridge = cmp.Or(cfg.Bridge, "bcbr0")
	cfg.SysfsRoot = cmp.Or(cfg.SysfsRoot, "/")
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// A typo in a flag is a start-up error, not a failure of the first
	// create.
	if !ifNameRE.MatchString(cfg.Bridge) {
		return nil, fmt.Errorf("hypervisor: bridge %q is not an interface name (1-15 characters)", cfg.Bridge)
	}
	if cfg.NetNS != "" && !ifNameRE.MatchString(cfg.NetNS) {
		return nil, fmt.Errorf("hypervisor: network namespace %q is not a namespace name", cfg.NetNS)
	}
	if cfg.BridgeAddress != "" {
		if p, err := netip.ParsePrefix(cfg.BridgeAddress); err != nil || !p.Addr().Is4() {
			return nil, fmt.Errorf("hypervisor: bridge address %q is not an IPv4 address/prefix", cfg.BridgeAddress)
		}
	}
	for _, d := range []string{dirInstances, dirVolumes, dirSnapshots, dirMeta} {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("hypervisor: state dir: %w", err)
		}
	}
	rt := cfg.Runtime
	if rt == nil {
		r, err := runtime.New(runtime.Config{StateDir: filepath.Join(cfg.StateDir, dirInstances), Accel: cfg.Accel,
			StopTimeout: cfg.StopTimeout, Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("hypervisor: %w", err)
		}
		rt = r
	}
	h := &Hypervisor{cfg: cfg, rt: rt, log: cfg.Logger, imgs: &images{dir: cfg.Images, verified: map[string]fileStamp{}},
		locks: map[string]*sync.Mutex{}}
	if b, ok := rt.(Balloons); ok {
		mi := cfg.MemInfo
		if mi == nil {
			mi = ProcMemInfo("/proc/meminfo")
		}
		c, err := NewBalloonController(BalloonConfig{MemInfo: mi,
			Balloons: b, Guests: h.balloonGuests, LowPercent: cfg.BalloonLowPercent, HighPercent: cfg.BalloonHighPercent,
			Interval: cfg.BalloonInterval, Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("hypervisor: %w", err)
		}
		h.balloons = c
	}
	return h, nil
}

// balloonGuests are the running guests with the floors their creates
// asked for (meta).
func (h *Hypervisor) balloonGuests(ctx context.Context) []BalloonGuest {
	var out []BalloonGuest
	for _, in := range h.rt.List(ctx) {
		if in.State != runtime.StateRunning {
			continue
		}
		out = append(out, BalloonGuest{ID: in.ID, MemoryMiB: in.Spec.MemoryMiB, FloorMiB: h.readMeta(in.ID).BalloonFloorMiB})
	}
	return out
}

// Balloons is the host's balloon controller (nil where the runtime moves
// no balloons); bcd runs it and registers its Collector.
func (h *Hypervisor) Balloons() *BalloonController { return h.balloons }

// Collector is the hypervisor's metrics (the balloon controller's), for
// bcd's registry; nil when there are none.
func (h *Hypervisor) Collector() prometheus.Collector {
	if h.balloons == nil {
		return nil
	}
	return h.balloons.Collector()
}

// Start checks the host's tools, probes the accelerator and hugepages
// once (so the first Hello does not wait on a probe boot), and re-adopts
// the instances in the state directory: guests whose QEMU survived a bcd
// restart are managed again.
func (h *Hypervisor) Start(ctx context.Context) error {
	if h.cfg.Runtime == nil {
		for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "ip", "mkfs.vfat", "mcopy"} {
			if _, err := exec.LookPath(tool); err != nil {
				return fmt.Errorf("hypervisor: %s is not installed (Debian: qemu-system-x86 qemu-utils iproute2 dosfstools mtools): %w", tool, err)
			}
		}
	}
	caps := h.rt.Capabilities(ctx)
	adopted, err := h.rt.Adopt(ctx)
	if err != nil {
		return fmt.Errorf("hypervisor: %w", err)
	}
	running := 0
	for _, in := range adopted {
		if in.State == runtime.StateRunning || in.State == runtime.StatePaused {
			running++
		}
	}
	h.dropStrayMeta(adopted)
	list := []string{vmcmd.CapInstances, vmcmd.CapVolumes, vmcmd.CapSnapshot}
	// Placement is advertised only where all of it is enforced: pinning
	// and NUMA binding always are; hugepages need a hugetlbfs mount.
	if caps.HugePages {
		list = append(list, vmcmd.CapPlacement)
	} else {
		h.log.Warn("hypervisor: instance.placement not advertised: no hugepages", "reason", caps.HugePagesReason)
	}
	if h.cfg.NetPolicy != nil && h.cfg.NetPolicy.Supported(ctx) {
		list = append(list, vmcmd.CapNetworkPolicy)
	} else {
		h.log.Warn("hypervisor: network policies other than egress are refused: no policy enforcement on this host")
	}
	h.mu.Lock()
	h.caps = list
	h.mu.Unlock()
	h.log.Info("hypervisor: ready", "accel", caps.Accel, "accel_reason", caps.AccelReason, "instances", len(adopted), "running", running)
	return nil
}

// dropStrayMeta removes metadata of instances the runtime no longer has
// (a delete that died between the runtime's delete and the metadata's).
func (h *Hypervisor) dropStrayMeta(known []runtime.Info) {
	entries, err := os.ReadDir(filepath.Join(h.cfg.StateDir, dirMeta))
	if err != nil {
		return
	}
	for _, e := range entries {
		id := trimExt(e.Name(), ".json")
		if !slices.ContainsFunc(known, func(in runtime.Info) bool { return in.ID == id }) {
			_ = os.Remove(filepath.Join(h.cfg.StateDir, dirMeta, e.Name()))
		}
	}
}

func trimExt(name, ext string) string {
	if len(name) > len(ext) && name[len(name)-len(ext):] == ext {
		return name[:len(name)-len(ext)]
	}
	return name
}

// Capabilities are the vmcmd capabilities this host enforces (after
// Start).
func (h *Hypervisor) Capabilities() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.caps)
}

func (h *Hypervisor) hasCap(c string) bool { return slices.Contains(h.Capabilities(), c) }

// lock serialises the operations on one instance (or volume) id.
func (h *Hypervisor) lock(key string) func() {
	h.mu.Lock()
	m := h.locks[key]
	if m == nil {
		m = &sync.Mutex{}
		h.locks[key] = m
	}
	h.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// Apply runs one command of vmcmd.Kinds with its params (JSON) and returns
// its result. Failures are *Error with a vmcmd failure code, or ctx's
// error.
func (h *Hypervisor) Apply(ctx context.Context, kind string, params []byte) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(params) == 0 {
		params = []byte("{}")
	}
	switch kind {
	case vmcmd.KindInstanceCreate:
		var p vmcmd.CreateParams
		if err := vmcmd.Decode(params, &p); err != nil {
			return nil, &Error{Code: vmcmd.FailInvalid, Err: err}
		}
		return h.create(ctx, &p)
	case vmcmd.KindInstanceStart, vmcmd.KindInstanceStop, vmcmd.KindInstanceReboot, vmcmd.KindInstancePause,
		vmcmd.KindInstanceResume:
		var p vmcmd.InstanceRef
		if err := vmcmd.Decode(params, &p); err != nil {
			return nil, &Error{Code: vmcmd.FailInvalid, Err: err}
		}
		if !vmcmd.ValidID(p.InstanceID) {
			return nil, invalid("instance_id", "%q is not an instance id (1-63 of a-z, 0-9 and '-')", p.InstanceID)
		}
		return h.power(ctx, kind, p.InstanceID)
	case vmcmd.KindInstanceDelete:
		var p vmcmd.DeleteParams
		if err := vmcmd.Decode(params, &p); err != nil {
			return nil, &Error{Code: vmcmd.FailInvalid, Err: err}
		}
		if !vmcmd.ValidID(p.InstanceID) {
			return nil, invalid("instance_id", "%q is not an instance id (1-63 of a-z, 0-9 and '-')", p.InstanceID)
		}
		for i, s := range p.KeepSnapshots {
			if !vmcmd.ValidID(s) {
				return nil, invalid(fmt.Sprintf("keep_snapshots[%d]", i), "%q is not a snapshot id (1-63 of a-z, 0-9 and '-')", s)
			}
		}
		return h.delete(ctx, p)
	case vmcmd.KindSnapshotDelete:
		var p vmcmd.SnapshotParams
		if err := vmcmd.Decode(params, &p); err != nil {
			return nil, &Error{Code: vmcmd.FailInvalid, Err: err}
		}
		if err := validSnapshot(p); err != nil {
			return nil, err
		}
		return h.snapshotDelete(p)
	case vmcmd.KindInstanceSnapshot, vmcmd.KindInstanceRestore:
		var p vmcmd.SnapshotParams
		if err := vmcmd.Decode(params, &p); err != nil {
			return nil, &Error{Code: vmcmd.FailInvalid, Err: err}
		}
		if err := validSnapshot(p); err != nil {
			return nil, err
		}
		if kind == vmcmd.KindInstanceSnapshot {
			return h.snapshot(ctx, p)
		}
		return h.restore(ctx, p)
	case vmcmd.KindInstanceList:
		var p struct{}
		if err := vmcmd.Decode(params, &p); err != nil {
			return nil, &Error{Code: vmcmd.FailInvalid, Err: err}
		}
		return h.list(ctx), nil
	case vmcmd.KindInstancePeers:
		var p vmcmd.PeersParams
		if err := vmcmd.Decode(params, &p); err != nil {
			return nil, &Error{Code: vmcmd.FailInvalid, Err: err}
		}
		return h.peers(ctx, p)
	case vmcmd.KindVolumeCreate, vmcmd.KindVolumeDelete:
		var p vmcmd.VolumeParams
		if err := vmcmd.Decode(params, &p); err != nil {
			return nil, &Error{Code: vmcmd.FailInvalid, Err: err}
		}
		if kind == vmcmd.KindVolumeCreate {
			return h.volumeCreate(ctx, p)
		}
		return h.volumeDelete(ctx, p)
	case vmcmd.KindVolumeAttach, vmcmd.KindVolumeDetach:
		var p vmcmd.AttachParams
		if err := vmcmd.Decode(params, &p); err != nil {
			return nil, &Error{Code: vmcmd.FailInvalid, Err: err}
		}
		if kind == vmcmd.KindVolumeAttach {
			return h.volumeAttach(ctx, p)
		}
		return h.volumeDetach(ctx, p)
	}
	return nil, failf(vmcmd.FailUnsupported, "hypervisor: unknown command kind %q", kind)
}

// runtimeErr maps a runtime failure to its code: a refused spec is the
// params' fault, a missing instance is not found, a stopped one is busy,
// anything else is the host's.
func runtimeErr(what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var se *runtime.SpecError
	switch {
	case errors.As(err, &se):
		return invalid(se.Field, "%s", se.Reason)
	case errors.Is(err, runtime.ErrNotFound):
		return &Error{Code: vmcmd.FailNotFound, Err: fmt.Errorf("%s: %w", what, err)}
	case errors.Is(err, runtime.ErrNotRunning):
		return &Error{Code: vmcmd.FailBusy, Err: fmt.Errorf("%s: %w", what, err)}
	}
	return &Error{Code: vmcmd.FailRuntime, Err: fmt.Errorf("%s: %w", what, err)}
}

// meta is what the hypervisor keeps beside the runtime's spec.
type meta struct {
	Degraded []string `json:"degraded,omitempty"`
	Policy   string   `json:"policy"`
	Address  string   `json:"address"`
	Tap      string   `json:"tap"`
	// BalloonFloorMiB is the create's balloon floor (0: no balloon).
	BalloonFloorMiB int `json:"balloon_floor_mib,omitempty"`
}

func (h *Hypervisor) metaPath(id string) string {
	return filepath.Join(h.cfg.StateDir, dirMeta, id+".json")
}

func (h *Hypervisor) readMeta(id string) meta {
	var m meta
	if b, err := os.ReadFile(h.metaPath(id)); err == nil {
		_ = json.Unmarshal(b, &m)
	}
	return m
}

func (h *Hypervisor) writeMeta(id string, m meta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("hypervisor: meta: %w", err)
	}
	tmp := h.metaPath(id) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("hypervisor: meta: %w", err)
	}
	if err := os.Rename(tmp, h.metaPath(id)); err != nil {
		return fmt.Errorf("hypervisor: meta: %w", err)
	}
	return nil
}
