// Package agent is bcd, the node agent: it joins the fleet with a join
// token, keeps one mutually authenticated session to the gateway, reports
// inventory, status and heartbeats, and applies commands at most once. It is
// a library so that the test kit's in-process fake daemons run exactly this
// code; cmd/bcd only parses flags and wires it.
//
// It must never send its private key anywhere, never take the join token
// from the command line, and never apply a command twice.
package agent

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/cgroups"
	"github.com/better-compute/better-compute/internal/agent/devfilter"
	"github.com/better-compute/better-compute/internal/agent/hw"
	"github.com/better-compute/better-compute/internal/agent/ramdisk"
	"github.com/better-compute/better-compute/internal/agent/sysfs"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/cmdsig"
	"github.com/better-compute/better-compute/internal/kubebind"
	"github.com/better-compute/better-compute/internal/release"
)

// Config configures an Agent. Zero values take the defaults noted.
type Config struct {
	// Server is the gateway's host:port, or several comma-separated. A
	// host that is a name is resolved at each round through the list, and
	// every address it resolves to is a gateway of its own, verified
	// against the name. A failed dial or a dropped session moves bcd to
	// the next address (after the reconnect backoff).
	Server string
	// LookupHost resolves a gateway's name (default net.DefaultResolver).
	LookupHost func(ctx context.Context, host string) ([]string, error)
	// StateDir holds the key, certificates and command log (created 0700).
	StateDir string
	// Hardware reads GPUs; nil means a node without GPUs.
	Hardware hw.Backend
	// SysfsRoot is where /sys and /proc are read from (default "/").
	SysfsRoot string
	// CgroupRoot is the cgroup bcd owns (default /sys/fs/cgroup/bettercompute).
	CgroupRoot string
	// Clock is the time source (default clock.Real).
	Clock clock.Clock
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Dialer replaces the TCP dialer, e.g. for in-memory listeners in tests.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
	// HeartbeatInterval overrides the interval the gateway asks for.
	HeartbeatInterval time.Duration
	// Version is reported in Join and Hello.
	Version string
	// Mode is how the agent runs (default AGENT_MODE_NODE).
	Mode agentv1.AgentMode
	// Ramdisk carries out the ramdisk's commands (disk.wipe, image.write,
	// logs.collect, inventory.refresh); required in AGENT_MODE_RAMDISK,
	// where it is all the agent runs.
	Ramdisk *ramdisk.Ramdisk
	// ReconnectMin and ReconnectMax bound the jittered exponential backoff
	// between sessions (default 0.5 s and 30 s).
	ReconnectMin, ReconnectMax time.Duration
	// HelloTimeout bounds a session's opening, from opening the stream to
	// the gateway's HelloAck; a gateway that accepts the connection and
	// then says nothing is given up on and dialled again (default 30 s).
	HelloTimeout time.Duration
	// KeepaliveTime is how long the connection may go without traffic from
	// the gateway before bcd pings it, and KeepaliveTimeout how long it
	// waits for the answer before it drops the connection: a half-open
	// connection (the gateway's host died) is noticed in their sum, not in
	// the kernel's ~15 minutes of TCP retransmissions. Defaults 30 s and
	// 10 s; KeepaliveTime is at least MinKeepaliveTime, the gateway's
	// enforcement floor.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// GoodbyeTimeout bounds how long a stopping agent waits for the gateway
	// to close the session after its Goodbye (default 5 s).
	GoodbyeTimeout time.Duration
	// PlainCgroupDir lets CgroupRoot be an ordinary directory instead of a
	// directory on a cgroup2 filesystem. Only a simulated node may (the
	// fake hardware mode and tests): a real one would report limits applied
	// that nothing enforces.
	PlainCgroupDir bool
	// DeviceFilter attaches allocations' device programs (default the
	// real BPF one; devfilter.Simulated with PlainCgroupDir). The start-up
	// probe attaches it once to a throw-away cgroup: only where that works
	// does bcd advertise devices.limits.
	DeviceFilter devfilter.Attacher
	// ExecIDFirst and ExecIDCount are the range of uids (and gids) bcd
	// gives allocations' processes, one per allocation (default
	// DefaultExecIDFirst, DefaultExecIDCount). No account of the host may
	// use them.
	ExecIDFirst, ExecIDCount uint32
	// Attest is the evidence the join brings besides its token.
	Attest AttestConfig
	// ExecHide are host paths, besides StateDir, that no allocation's
	// process may reach (they are covered by an empty tmpfs in its mount
	// namespace).
	ExecHide []string
	// Commands applies the command kinds bcd does not know itself (site
	// mode's bmc.power and site.machines); nil leaves them UNKNOWN_KIND.
	Commands CommandHandler
	// DaemonCommands, when set, applies daemon.upgrade and daemon.rollback
	// instead of bcd replacing its own executable: a simulated node has
	// no executable of its own to replace.
	DaemonCommands CommandHandler
	// BMCDrivers are the BMC drivers a site agent (mode site) reports in
	// its Hello: what machines of its site may name.
	BMCDrivers []*agentv1.BMCDriver
	// Instances runs the instance and volume commands (vmcmd.Kinds) and
	// names the capabilities it enforces; nil fails them
	// INSTANCE_NO_HYPERVISOR and advertises none.
	Instances InstanceRunner
	// KubeletPluginsRegistered reports whether bcd's kubelet device plugin
	// or DRA driver is registered with the node's kubelet: only then does
	// bcd advertise binding.kubernetes, the capability reservations the
	// kubelet binds place on. Asked at each Hello; nil means never.
	KubeletPluginsRegistered func() bool
	// Kube is the node's offer to its kubelet: allocation.bind with
	// binding kubernetes offers the GPUs there instead of making a
	// cgroup, and allocation.release withdraws them. nil: bcd offers
	// nothing to a kubelet and refuses binding kubernetes. When set,
	// KubeletPluginsRegistered defaults to Kube.Registered.
	Kube *kubebind.Set
	// KubeHolders is closed once Kube's pod holders are the kubelet's
	// (package podresources' Synced): a bcd that restarted while pods
	// still held a released allocation's GPUs completes that release only
	// after. nil: they are known from the start.
	KubeHolders <-chan struct{}
	// NodeLabels, when set, reads the labels the node's platform gives it
	// (its Kubernetes Node's), sent as the inventory's "labels" section;
	// pools select nodes by them. NodeLabelsChanged, when set, is closed
	// at their next change, and bcd then sends its inventory again.
	NodeLabels        func(ctx context.Context) (map[string]string, error)
	NodeLabelsChanged func() <-chan struct{}
	// NodeLabelsSource says where NodeLabels come from, e.g.
	// "kubernetes/node/NAME".
	NodeLabelsSource string
	// Tracing records a span per command applied, a child of the span
	// that sent it; nil records none (the command's traceparent still
	// goes back with its update).
	Tracing trace.TracerProvider
	// HealthInterval is how often bcd reads its GPUs' standing health
	// findings, when Hardware is a hw.HealthSource (default 60 s); it
	// also reads them at each new session.
	HealthInterval time.Duration
	// Reboot reboots the machine for node.reboot (default systemctl
	// reboot).
	Reboot func(ctx context.Context) error
	// ReleaseKeys are the release public keys daemon.upgrade trusts;
	// none refuses every upgrade (RELEASE_UNTRUSTED) and leaves the
	// daemon.upgrade capability out of Hello.
	ReleaseKeys []release.PublicKey
	// Executable is the path daemon.upgrade replaces (default
	// os.Executable, symlinks resolved).
	Executable string
	// Reexec replaces the process with the binary at path after an
	// upgrade, a rollback or a revert (default syscall.Exec with the same
	// arguments and environment). It returns only on failure.
	Reexec func(path string) error
	// UpgradeDownloadTimeout bounds daemon.upgrade's download (default
	// 10 min; the command's deadline, when earlier, bounds it too).
	UpgradeDownloadTimeout time.Duration
}

// MinKeepaliveTime is the shortest KeepaliveTime: the gateway answers
// pings more frequent than this by closing the connection.
const MinKeepaliveTime = 10 * time.Second

func (c *Config) setDefaults() error {
	if c.Server == "" {
		return errors.New("agent: Server is required")
	}
	if _, err := ParseServers(c.Server); err != nil {
		return fmt.Errorf("agent: Server: %w", err)
	}
	if c.LookupHost == nil {
		c.LookupHost = net.DefaultResolver.LookupHost
	}
	if c.StateDir == "" {
		return errors.New("agent: StateDir is required")
	}
	// Absolute, so that confined processes' mounts can name it.
	dir, err := filepath.Abs(c.StateDir)
	if err != nil {
		return fmt.Errorf("agent: StateDir: %w", err)
	}
	c.StateDir = dir
	c.SysfsRoot = cmp.Or(c.SysfsRoot, "/")
	c.CgroupRoot = cmp.Or(c.CgroupRoot, "/sys/fs/cgroup/bettercompute")
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Version = cmp.Or(c.Version, "dev")
	if c.Mode == agentv1.AgentMode_AGENT_MODE_UNSPECIFIED {
		c.Mode = agentv1.AgentMode_AGENT_MODE_NODE
	}
	if c.Mode == agentv1.AgentMode_AGENT_MODE_RAMDISK && c.Ramdisk == nil {
		return errors.New("agent: ramdisk mode needs Ramdisk")
	}
	c.ReconnectMin = cmp.Or(c.ReconnectMin, 500*time.Millisecond)
	c.ReconnectMax = cmp.Or(c.ReconnectMax, 30*time.Second)
	c.HelloTimeout = cmp.Or(c.HelloTimeout, 30*time.Second)
	c.KeepaliveTime = cmp.Or(c.KeepaliveTime, 30*time.Second)
	c.KeepaliveTimeout = cmp.Or(c.KeepaliveTimeout, 10*time.Second)
	c.GoodbyeTimeout = cmp.Or(c.GoodbyeTimeout, 5*time.Second)
	c.HealthInterval = cmp.Or(c.HealthInterval, 60*time.Second)
	if c.Reboot == nil {
		c.Reboot = systemctlReboot
	}
	if c.Executable == "" {
		// Resolved now: once an upgrade renamed a new binary over it,
		// the running one's path reads "… (deleted)".
		if exe, err := os.Executable(); err == nil {
			if real, err := filepath.EvalSymlinks(exe); err == nil {
				c.Executable = real
			}
		}
	}
	if c.Reexec == nil {
		c.Reexec = reexec
	}
	c.UpgradeDownloadTimeout = cmp.Or(c.UpgradeDownloadTimeout, 10*time.Minute)
	switch {
	case c.HelloTimeout < 0 || c.KeepaliveTimeout < 0 || c.GoodbyeTimeout < 0:
		return errors.New("agent: HelloTimeout, KeepaliveTimeout and GoodbyeTimeout must not be negative")
	case c.HealthInterval < 0:
		return errors.New("agent: HealthInterval must not be negative")
	case c.KeepaliveTime < MinKeepaliveTime:
		return fmt.Errorf("agent: keepalive %v is below the gateway's minimum of %v", c.KeepaliveTime, MinKeepaliveTime)
	}
	if !c.PlainCgroupDir {
		if err := cgroups.CheckRoot(c.CgroupRoot); err != nil {
			return fmt.Errorf("agent: cgroup root %s: %w", c.CgroupRoot, err)
		}
	}
	c.ExecIDFirst = cmp.Or(c.ExecIDFirst, DefaultExecIDFirst)
	c.ExecIDCount = cmp.Or(c.ExecIDCount, DefaultExecIDCount)
	if uint64(c.ExecIDFirst)+uint64(c.ExecIDCount) > 1<<32-1 {
		return fmt.Errorf("agent: exec ids %d+%d run past the largest uid", c.ExecIDFirst, c.ExecIDCount)
	}
	if c.DeviceFilter == nil {
		c.DeviceFilter = devfilter.BPF{}
		if c.PlainCgroupDir {
			c.DeviceFilter = devfilter.Simulated{}
		}
	}
	return nil
}

// ErrAlreadyJoined is returned by Join when the state directory already
// holds a node identity.
var ErrAlreadyJoined = errors.New("agent already joined")

// ErrNotJoined is returned by Run before Join succeeded.
var ErrNotJoined = errors.New("agent not joined: run with a join token first")

// ErrAlreadyRunning is returned by a second concurrent Run: one session per
// process.
var ErrAlreadyRunning = errors.New("agent session loop already running")

// Agent is one node agent.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	dir     stateDir
	fs      sysfs.FS
	cg      cgroups.Manager
	filter  devfilter.Attacher
	iso     isolation
	ids     *execIDs
	metrics *metrics
	xids    xidCounts
	running atomic.Bool
	gws     *gateways

	mu    sync.Mutex
	node  nodeState
	cert  *tls.Certificate
	leaf  *x509.Certificate
	roots *x509.CertPool
	cmds  commandState
	// cmdTrust is the pinned command-signing bundle; nil until one is.
	cmdTrust    *commandTrust
	cmdVerifier cmdsig.Verifier
	failKinds   map[string]string
	sess        *session
	events      []*agentv1.HealthEvent
	canceled    map[string]bool // command ids canceled before they ran
	running1    *runningCommand
	execs       map[string]*runningCommand // process.exec commands running
	execWG      sync.WaitGroup
	instOrder   keyedOrder
	// runCtx is Run's context, for work that outlives a command.
	runCtx context.Context
	// findings is the last health poll's (health.go); healthMu keeps
	// polls one at a time.
	findings findingState
	healthMu sync.Mutex

	// kubeMu guards kube, what is offered to the kubelet (Config.Kube).
	kubeMu     sync.Mutex
	kube       kubeState
	kubeWG     sync.WaitGroup
	kubeSendMu sync.Mutex

	queue chan *agentv1.Command

	// upgradeMu keeps upgrade.json and the executable's swaps one at a
	// time (upgrade.go).
	upgradeMu sync.Mutex
}

// New opens the state directory and loads an existing identity, if any.
func New(cfg Config) (*Agent, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.Attest.Validate(); err != nil {
		return nil, err
	}
	a := &Agent{
		cfg:       cfg,
		log:       cfg.Logger,
		dir:       stateDir(cfg.StateDir),
		fs:        sysfs.FS{Root: cfg.SysfsRoot},
		cg:        cgroups.Manager{Root: cfg.CgroupRoot},
		filter:    cfg.DeviceFilter,
		metrics:   newMetrics(),
		failKinds: map[string]string{},
		canceled:  map[string]bool{},
		execs:     map[string]*runningCommand{},
		queue:     make(chan *agentv1.Command, 256),
	}
	a.ids = &execIDs{dir: a.dir, first: cfg.ExecIDFirst, count: cfg.ExecIDCount}
	// The hypervisor's own metrics (the balloon controller's) are served
	// with the agent's.
	if c, ok := cfg.Instances.(interface{ Collector() prometheus.Collector }); ok && c.Collector() != nil {
		if err := a.metrics.reg.Register(c.Collector()); err != nil {
			return nil, fmt.Errorf("agent: instance metrics: %w", err)
		}
	}
	if cfg.Kube != nil && a.cfg.KubeletPluginsRegistered == nil {
		a.cfg.KubeletPluginsRegistered = cfg.Kube.Registered
	}
	entries, _ := ParseServers(cfg.Server) // checked by setDefaults
	a.gws = &gateways{entries: entries, lookup: cfg.LookupHost}
	a.metrics.reg.MustRegister(gpuCollector{a: a})
	if err := a.dir.ensure(); err != nil {
		return nil, err
	}
	a.iso = probeIsolation(a.cg, a.filter, cfg.PlainCgroupDir)
	if cfg.Mode == agentv1.AgentMode_AGENT_MODE_RAMDISK {
		a.iso.execErr = errors.New("a ramdisk runs no allocation's processes")
	} else {
		a.iso.execErr = probeExec(a.cg, cfg.ExecIDFirst)
	}
	if a.iso.execErr != nil {
		a.log.Warn("processes are not confined: exec.isolated is not advertised", "reason", a.iso.execErr)
	}
	for _, c := range cgroups.Controllers {
		if why := a.iso.controllers[c]; why != "" {
			a.log.Warn("limits not enforced on this node", "controller", c, "reason", why)
		}
	}
	if a.iso.devicesErr != nil {
		a.log.Warn("no device filter: devices.limits is not advertised", "reason", a.iso.devicesErr)
	}
	if _, err := a.dir.readJSON(commandsFile, &a.cmds); err != nil {
		return nil, err
	}
	if f := a.cmds.InFlight; f != nil {
		// The process died while applying this command. It may have had
		// effects, so it must not run again: report it as interrupted.
		a.cmds.add(commandRecord{Seq: f.Seq, ID: f.ID, Kind: f.Kind, Update: marshalUpdate(&agentv1.CommandUpdate{
			CommandId: f.ID, Seq: f.Seq, State: agentv1.CommandState_COMMAND_STATE_FAILED,
			FailureCode: "INTERRUPTED", Message: "bcd restarted while applying this command",
		})})
		a.cmds.InFlight = nil
		if err := a.dir.writeJSON(commandsFile, &a.cmds); err != nil {
			return nil, err
		}
	}
	if len(a.cmds.Execs) > 0 {
		// Processes that were running when bcd died: their output is
		// lost and their exit unknown, so they end INTERRUPTED. Whatever
		// is left of them is killed with the allocation's cgroup. An
		// instance command ends INTERRUPTED too; the control plane
		// resends it (they converge) or reads instance.list.
		for _, f := range a.cmds.Execs {
			msg := "bcd restarted while this process ran"
			if isInstanceKind(f.Kind) {
				msg = "bcd restarted while applying this command"
			}
			a.cmds.add(commandRecord{Seq: f.Seq, ID: f.ID, Kind: f.Kind, Update: marshalUpdate(&agentv1.CommandUpdate{
				CommandId: f.ID, Seq: f.Seq, State: agentv1.CommandState_COMMAND_STATE_FAILED,
				FailureCode: FailInterrupted, Message: msg,
			})})
		}
		a.cmds.Execs = nil
		if err := a.dir.writeJSON(commandsFile, &a.cmds); err != nil {
			return nil, err
		}
	}
	if cfg.Kube != nil {
		if err := a.loadKube(); err != nil {
			return nil, err
		}
	}
	ok, err := a.dir.readJSON(nodeFile, &a.node)
	if err != nil {
		return nil, err
	}
	if ok && a.node.NodeID != "" {
		if err := a.loadIdentity(); err != nil {
			return nil, err
		}
	}
	return a, nil
}

func (a *Agent) loadIdentity() error {
	cert, err := a.dir.loadCredentials()
	if err != nil {
		return err
	}
	bundle, err := a.dir.read(trustFile)
	if err != nil {
		return fmt.Errorf("read trust bundle: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		return errors.New("trust bundle holds no certificates")
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("parse node certificate: %w", err)
	}
	cert.Leaf = leaf
	// bcd presents its leaf alone: every gateway trusts the node CA itself
	// (its client pool holds it), so sending the CA too only made each
	// connection parse and keep a second certificate there, about 3 KiB a
	// session (docs/benchmarks.md).
	cert.Certificate = cert.Certificate[:1]
	a.mu.Lock()
	a.cert, a.leaf, a.roots = cert, leaf, roots
	a.mu.Unlock()
	if err := a.loadCommandTrust(); err != nil {
		return err
	}
	a.metrics.certExpiry.Set(float64(leaf.NotAfter.Unix()))
	return nil
}

// NodeID is the node's id, empty before it joined.
func (a *Agent) NodeID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.node.NodeID
}

// Joined reports whether the agent holds a node identity.
func (a *Agent) Joined() bool { return a.NodeID() != "" }

// Certificate returns the current node certificate (leaf), nil before join.
func (a *Agent) Certificate() *x509.Certificate {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.leaf
}

// LastAppliedSeq is the highest command sequence number applied.
func (a *Agent) LastAppliedSeq() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cmds.LastAppliedSeq
}

// Connected reports whether a session is established (HelloAck received).
func (a *Agent) Connected() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sess != nil
}

// FailCommands makes every later command of kind fail with failureCode
// (a test hook); an empty failureCode clears it.
func (a *Agent) FailCommands(kind, failureCode string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if failureCode == "" {
		delete(a.failKinds, kind)
		return
	}
	a.failKinds[kind] = failureCode
}

// DropSession closes the current session as if the connection broke; Run
// reconnects with backoff (a test hook). It reports whether one was open.
func (a *Agent) DropSession() bool {
	a.mu.Lock()
	s := a.sess
	a.mu.Unlock()
	if s == nil {
		return false
	}
	s.cancel()
	return true
}

// ReportHealthEvent records a health finding (e.g. kind "gpu.xid" with the
// GPU's UUID and the XID code) and sends a StatusReport at once when a
// session is up. The node reports "degraded" while events are held.
func (a *Agent) ReportHealthEvent(ev *agentv1.HealthEvent) {
	if ev.GetTime() == nil {
		// Stamped once: the control plane tells a repeat (bcd sends the
		// events it holds again on every new session) by its time.
		ev.Time = timestamppb.New(a.cfg.Clock.Now())
	}
	a.xids.add(ev)
	a.quarantineKube(ev)
	a.mu.Lock()
	a.events = append(a.events, ev)
	if len(a.events) > 32 {
		a.events = a.events[len(a.events)-32:]
	}
	s := a.sess
	a.mu.Unlock()
	if s != nil {
		_ = s.send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Status{Status: a.status()}})
	}
}

// ClearHealthEvents forgets recorded health events: the node is "ok" again.
func (a *Agent) ClearHealthEvents() {
	a.clearKubeHealth()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = nil
}

// Gateway is the address of the gateway the session is established
// with, "" between sessions.
func (a *Agent) Gateway() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sess == nil {
		return ""
	}
	return a.sess.gateway.addr
}

// cgroupVersion is the host layout, read below SysfsRoot.
func (a *Agent) cgroupVersion() string {
	return cgroups.Version(filepath.Join(a.cfg.SysfsRoot, "sys/fs/cgroup"))
}

var _ io.Closer = (*Agent)(nil)

// Close releases the hardware backend.
func (a *Agent) Close() error {
	if a.cfg.Hardware != nil {
		return a.cfg.Hardware.Close()
	}
	return nil
}
