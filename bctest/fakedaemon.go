package bctest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/cgroups"
	"github.com/better-compute/better-compute/internal/agent/devfilter"
	"github.com/better-compute/better-compute/internal/agent/hw/fake"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/kubebind"
	"github.com/better-compute/better-compute/internal/release"
)

// FakeDaemonConfig describes one simulated node.
type FakeDaemonConfig struct {
	// Gateway is the gateway's host:port, or several comma-separated (the
	// replicas of one control plane): the node moves to the next one when
	// its session fails, as bcd --server does.
	Gateway string
	// StateDir holds the agent's key, certificates and command log; reusing
	// it after Stop is a restart of the same machine.
	StateDir string
	// SysfsRoot is the host facts tree; empty writes a DGX-like one under
	// StateDir.
	SysfsRoot string
	// Profile is the go-nvml mock: dgxh100 (default), dgxa100 or dgxb200.
	Profile string
	// Seed makes the machine unique (GPU UUIDs, DMI); default the state dir.
	Seed              string
	Clock             clock.Clock
	Logger            *slog.Logger
	HeartbeatInterval time.Duration
	// ReconnectMin/Max bound the reconnect backoff (default 50 ms / 2 s, so
	// simulations converge fast).
	ReconnectMin, ReconnectMax time.Duration
	// DeviceFilter replaces the simulated device filter, e.g. with one
	// that fails, for a node that cannot confine its GPUs (it then does
	// not advertise devices.limits).
	DeviceFilter devfilter.Attacher
	// CgroupRoot, when set, is a directory on a cgroup2 filesystem: the
	// node's allocations become real cgroups with the real device filter,
	// and reservations exec runs processes inside them (see
	// RealCgroupRoot). Empty keeps them in a plain directory under
	// StateDir, enforcing nothing.
	CgroupRoot string
	// Tracing records the agent's command spans; nil records none.
	Tracing trace.TracerProvider
	// Hypervisor answers the instance and volume commands (vmcmd); nil
	// gives the node a FakeHypervisor of its own.
	Hypervisor *FakeHypervisor
	// Hide are host paths, besides StateDir, that no allocation's process
	// and no guest's command may reach (dev's state directory, with its
	// admin key and database).
	Hide []string
	// Kubelet makes the node advertise binding.kubernetes, as a bcd whose
	// kubelet plugins are registered does, so that reservations the
	// kubelet binds place on it; without Kube it gets a Set of its own,
	// registered, that no pod ever holds.
	Kubelet bool
	// Kube is the node's offer to its kubelet, as bcd --kubernetes has
	// one: allocation.bind with binding kubernetes offers the GPUs there,
	// and the node advertises binding.kubernetes while a plugin is
	// registered in it (package deviceplugin with bctest/kubelet, or
	// Set.SetRegistered). A restart keeps the same Set unless RestartWith
	// gives a new one, as a new bcd process has.
	Kube *kubebind.Set
	// KubeHolders is closed once Kube's pod holders are the kubelet's
	// (podresources.Poller.Synced); nil: known from the start.
	KubeHolders <-chan struct{}
	// HealthInterval is how often the node reads its GPUs' health
	// findings (default the agent's); PollHealth reads them at once.
	HealthInterval time.Duration
	// Version is bcd's version the node reports in its Hello
	// (agent_version); default "sim". daemon.upgrade and daemon.rollback
	// change it as bcd's re-exec does.
	Version string
	// ReleaseKeys are the release public keys the node trusts (bcd
	// --release-pubkey): daemon.upgrade verifies the manifest against
	// them, and without any it refuses with RELEASE_UNTRUSTED.
	ReleaseKeys []release.PublicKey
	// BadVersions make an upgrade to a version go wrong after the node
	// restarts on it (see BadVersion).
	BadVersions map[string]BadVersion
	// PreviousVersion is the version of the binary bcd kept at its last
	// upgrade (upgrade.json): what daemon.rollback can go back to.
	PreviousVersion string
}

// BadVersion is how an upgrade to a bad version goes wrong.
type BadVersion int

const (
	// VersionFinding: the node comes back on the version and reports a
	// health finding (an XID with no GPU named, recorded).
	VersionFinding BadVersion = iota + 1
	// VersionGone: the node never comes back (its bcd dies on start); it
	// stays down until Restart.
	VersionGone
)

// RealCgroupRoot returns a directory under the machine's cgroup2 mount
// where simulated nodes can make real cgroups (dir names it), after
// checking that this process may create one there and attach a device
// filter to it; "" with the reason when it may not (not root, no cgroup2,
// no BPF).
func RealCgroupRoot(dir string) (string, error) {
	mount := cgroups.Cgroup2Mount()
	if mount == "" {
		return "", errors.New("no cgroup2 filesystem is mounted")
	}
	root := filepath.Join(mount, dir)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", root, err)
	}
	probe, err := os.MkdirTemp(root, "probe-")
	if err != nil {
		return "", fmt.Errorf("create a cgroup under %s: %w", root, err)
	}
	defer func() { _ = os.Remove(probe) }()
	if err := (devfilter.BPF{}).Attach(probe, devfilter.Pseudo()); err != nil {
		return "", fmt.Errorf("attach a device filter under %s: %w", root, err)
	}
	return root, nil
}

// FakeDaemon is an in-process bcd: the real agent code with go-nvml's mock
// GPUs, speaking the real protocol to the gateway over loopback mTLS. The
// embedded *agent.Agent exposes the scripting hooks: FailCommands,
// DropSession, ReportHealthEvent.
//
// daemon.upgrade and daemon.rollback replace the embedded agent (a new
// process of bcd on the same state dir): while one runs, call the
// daemon's methods only after the node is seen back (or Stop).
type FakeDaemon struct {
	*agent.Agent
	hw     *fake.Backend
	cfg    FakeDaemonConfig
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	// mu orders Stop against an upgrade's restart.
	mu      sync.Mutex
	stopped bool
	// closed: the embedded agent was stopped and closed (it stays, so its
	// node id and state can still be read after Stop).
	closed bool
}

// NewFakeDaemon builds a simulated node; Join it (first time) then Start.
func NewFakeDaemon(cfg FakeDaemonConfig) (*FakeDaemon, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("bctest: FakeDaemon needs a StateDir")
	}
	cfg.Profile = cmp.Or(cfg.Profile, "dgxh100")
	cfg.Seed = cmp.Or(cfg.Seed, cfg.StateDir)
	cfg.ReconnectMin = cmp.Or(cfg.ReconnectMin, 50*time.Millisecond)
	cfg.ReconnectMax = cmp.Or(cfg.ReconnectMax, 2*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.SysfsRoot == "" {
		cfg.SysfsRoot = filepath.Join(cfg.StateDir, "host")
		if err := WriteSimHost(cfg.SysfsRoot); err != nil {
			return nil, fmt.Errorf("bctest: write sim host: %w", err)
		}
	}
	if cfg.Hypervisor == nil {
		cfg.Hypervisor = NewFakeHypervisor()
	}
	if cfg.Kubelet && cfg.Kube == nil {
		cfg.Kube = kubebind.New()
		cfg.Kube.SetRegistered("bctest", true)
	}
	d := &FakeDaemon{cfg: cfg}
	if err := d.build(); err != nil {
		return nil, err
	}
	return d, nil
}

// build makes the node's hardware and agent from d.cfg: a start of bcd.
func (d *FakeDaemon) build() error {
	cfg := d.cfg
	hw, err := fake.New(fake.Options{Model: cfg.Profile, Seed: cfg.Seed})
	if err != nil {
		return err
	}
	if cfg.Hypervisor.Root() == "" {
		cfg.Hypervisor.SetRoot(filepath.Join(cfg.StateDir, "guests"))
	}
	cfg.Hypervisor.Hide(append([]string{cfg.StateDir}, cfg.Hide...)...)
	cfg.Hypervisor.reopen()
	cgroupRoot, plain := filepath.Join(cfg.StateDir, "cgroup"), true
	if cfg.CgroupRoot != "" {
		cgroupRoot, plain = cfg.CgroupRoot, false
	}
	// node.reboot power-cycles the fake machine: its findings but a
	// failed remap clear, and the session drops and comes back.
	var a *agent.Agent
	reboot := func(context.Context) error {
		hw.Reboot()
		a.DropSession()
		return nil
	}
	a, err = agent.New(agent.Config{
		Server: cfg.Gateway, StateDir: cfg.StateDir, Hardware: hw, SysfsRoot: cfg.SysfsRoot,
		CgroupRoot: cgroupRoot, PlainCgroupDir: plain, DeviceFilter: cfg.DeviceFilter, Clock: cfg.Clock, Logger: cfg.Logger,
		HeartbeatInterval: cfg.HeartbeatInterval, Version: cmp.Or(cfg.Version, "sim"),
		ReconnectMin: cfg.ReconnectMin, ReconnectMax: cfg.ReconnectMax, Tracing: cfg.Tracing, Instances: cfg.Hypervisor.Runner(),
		ExecHide: cfg.Hide, Kube: cfg.Kube, KubeHolders: cfg.KubeHolders, KubeletPluginsRegistered: kubeletRegistered(cfg),
		HealthInterval: cfg.HealthInterval, Reboot: reboot, DaemonCommands: daemonCommands{d: d},
	})
	if err != nil {
		return errors.Join(err, hw.Close())
	}
	d.Agent, d.hw, d.closed = a, hw, false
	return nil
}

// kubeletRegistered: Kubelet says registered; else, with Kube, the
// agent asks Kube; else never.
func kubeletRegistered(cfg FakeDaemonConfig) func() bool {
	if cfg.Kubelet {
		return func() bool { return true }
	}
	return nil
}

// Start runs the agent's session loop in the background until Stop.
func (d *FakeDaemon) Start() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.startLocked()
}

func (d *FakeDaemon) startLocked() {
	ctx, cancel := context.WithCancel(context.Background())
	done, a := make(chan error, 1), d.Agent
	d.cancel, d.done = cancel, done
	go func() { done <- a.Run(ctx) }()
}

// Stop ends the session loop and releases the agent, like stopping bcd
// with SIGTERM: the agent says goodbye and its node turns unreachable at
// once.
func (d *FakeDaemon) Stop() error {
	var err error
	d.once.Do(func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		err = d.stopLocked()
		d.stopped = true
		d.cfg.Hypervisor.Close()
	})
	return err
}

// stopLocked ends the running agent, if any, and closes it.
func (d *FakeDaemon) stopLocked() error {
	if d.Agent == nil || d.closed {
		return nil
	}
	var err error
	if d.cancel != nil {
		d.cancel()
		if rerr := <-d.done; rerr != nil && !errors.Is(rerr, context.Canceled) {
			err = rerr
		}
		d.cancel = nil
	}
	err = errors.Join(err, d.Close())
	d.closed = true
	return err
}

// Restart stops this daemon and returns a new one on the same state dir:
// the same machine, keeping its identity, started.
func (d *FakeDaemon) Restart() (*FakeDaemon, error) {
	return d.RestartWith(nil)
}

// RestartWith is Restart with the configuration changed by change first
// (e.g. a device filter that no longer attaches).
func (d *FakeDaemon) RestartWith(change func(*FakeDaemonConfig)) (*FakeDaemon, error) {
	if err := d.Stop(); err != nil {
		return nil, err
	}
	cfg := d.cfg
	if change != nil {
		change(&cfg)
	}
	nd, err := NewFakeDaemon(cfg)
	if err != nil {
		return nil, err
	}
	nd.Start()
	return nd, nil
}

// CgroupRoot is where the simulated node writes allocation cgroups.
func (d *FakeDaemon) CgroupRoot() string {
	if d.cfg.CgroupRoot != "" {
		return d.cfg.CgroupRoot
	}
	return filepath.Join(d.cfg.StateDir, "cgroup")
}

// StateDir is the node's state directory (its key, certificates and
// command log).
func (d *FakeDaemon) StateDir() string { return d.cfg.StateDir }

// Hypervisor is the node's fake hypervisor (its instances and volumes).
func (d *FakeDaemon) Hypervisor() *FakeHypervisor { return d.cfg.Hypervisor }

// Kube returns the node's offer to its kubelet (nil without Kube or
// Kubelet): a test plays the pods that hold its GPUs on it.
func (d *FakeDaemon) Kube() *kubebind.Set { return d.cfg.Kube }

// InjectFinding makes GPU gpuIndex of the node show a standing health
// finding of kind (gpuhealth.Kinds but gpu.xid) with code; the node
// reports it at its next poll (PollHealth polls now). See
// fake.Backend.InjectFinding for what code means per kind.
func (d *FakeDaemon) InjectFinding(kind string, gpuIndex int, code int64) {
	d.hw.InjectFinding(kind, gpuIndex, code)
}

// ClearFinding takes the finding of kind off GPU gpuIndex; the node's next
// poll reports the set without it.
func (d *FakeDaemon) ClearFinding(kind string, gpuIndex int) { d.hw.ClearFinding(kind, gpuIndex) }

// InjectXID raises XID code on GPU gpuIndex with process pid (0: none)
// running on it; the node reports it as a health event at once.
func (d *FakeDaemon) InjectXID(gpuIndex int, code int64, pid int64) {
	d.hw.InjectXID(gpuIndex, code, pid)
}

// Hardware is the node's fake GPU machine.
func (d *FakeDaemon) Hardware() *fake.Backend { return d.hw }
