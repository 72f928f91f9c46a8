// Command bcd is the better-compute node agent. It only parses flags and the
// config file and wires internal/agent; see that package for what bcd does.
//
// The join token is read from the environment (BCD_JOIN_TOKEN) or stdin
// (--token-stdin), never from the command line, where every user of the
// host could read it.
//
// `bcd version` prints the version alone on stdout (what daemon.upgrade
// runs to probe a downloaded binary).
//
// `bcd secret get secret://NAME` fetches a secret of the node's tenant
// through the gateway and prints it (docs/secrets.md).
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/cgroups"
	"github.com/better-compute/better-compute/internal/agent/hw"
	"github.com/better-compute/better-compute/internal/agent/hw/fake"
	"github.com/better-compute/better-compute/internal/agent/hw/nvml"
	"github.com/better-compute/better-compute/internal/agent/hypervisor"
	"github.com/better-compute/better-compute/internal/agent/netpolicy"
	"github.com/better-compute/better-compute/internal/agent/ramdisk"
	"github.com/better-compute/better-compute/internal/agent/site"
	"github.com/better-compute/better-compute/internal/site/pxe"
	"github.com/better-compute/better-compute/internal/tracing"
	"github.com/better-compute/better-compute/pkg/driver"
)

var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if len(os.Args) == 2 && os.Args[1] == "version" {
		// What daemon.upgrade's probe runs: the version alone, on stdout.
		fmt.Println(version)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "secret" {
		err = runSecret(ctx, os.Args[2:], os.Stdout, os.Stderr)
	} else {
		err = run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bcd:", err)
		os.Exit(1)
	}
}

// errTokenInArgv refuses anything on the command line that looks like a
// join token.
var errTokenInArgv = errors.New("a join token is never accepted on the command line: set BCD_JOIN_TOKEN or pipe it to --token-stdin")

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stderr io.Writer) error {
	for _, a := range args {
		if strings.Contains(a, agent.TokenPrefix) || strings.Contains(a, agent.DiscoveryTokenPrefix) || strings.HasPrefix(strings.TrimLeft(a, "-"), "token=") || strings.TrimLeft(a, "-") == "token" {
			return errTokenInArgv
		}
	}
	var o options
	fs := flag.NewFlagSet("bcd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.showVersion {
		_, _ = fmt.Fprintln(stderr, version)
		return nil
	}
	if o.configFile != "" {
		fc, err := loadConfigFile(o.configFile)
		if err != nil {
			return err
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		o.merge(fc, set)
	}
	// A commissioning ramdisk finds its gateway and discovery token on the
	// kernel command line the site's iPXE script wrote.
	var boot ramdisk.Boot
	if o.mode == "ramdisk" {
		b, err := os.ReadFile(filepath.Join(o.sysfsRoot, "proc/cmdline"))
		if err == nil {
			boot, _ = ramdisk.ParseCmdline(string(b))
		}
		o.server = cmp.Or(o.server, boot.Server)
	}
	if err := o.validate(); err != nil {
		return err
	}
	log, err := newLogger(o.logLevel, stderr)
	if err != nil {
		return err
	}
	releaseKeys, err := loadReleaseKeys(o.releaseKeys)
	if err != nil {
		return err
	}
	mode, err := parseMode(o.mode)
	if err != nil {
		return err
	}
	// A simulated node keeps its "cgroups" in a plain directory; a real one
	// must write where the kernel enforces, or it would report limits that
	// nothing applies.
	// The hardware is checked first: a backend this build cannot run is the
	// more basic mistake.
	var rd *ramdisk.Ramdisk
	logs := &ramdisk.LogRing{}
	if mode == agentv1.AgentMode_AGENT_MODE_RAMDISK {
		// The ramdisk reads its hardware from sysfs and runs no
		// allocations: no GPU library, no cgroups.
		o.hardware, o.cgroupRoot = "none", filepath.Join(o.stateDir, "cgroup")
		rcfg := ramdisk.Config{SysfsRoot: o.sysfsRoot, SpoolDir: o.spoolDir, Logs: logs.String,
			ImagesURL: boot.Images, Server: o.server}
		if o.imageKeys != "" {
			if rcfg.TrustedImageKeys, err = ramdisk.LoadTrustedKeys(o.imageKeys); err != nil {
				return fmt.Errorf("--trusted-image-keys: %w", err)
			}
		}
		rd = ramdisk.New(rcfg)
		log = slog.New(slog.NewTextHandler(io.MultiWriter(stderr, logs), &slog.HandlerOptions{Level: logLevel(o.logLevel)}))
	}
	if mode == agentv1.AgentMode_AGENT_MODE_SITE {
		// A site agent runs no allocations: no cgroups to enforce with.
		o.cgroupRoot = filepath.Join(o.stateDir, "cgroup")
	}
	execFirst, execCount, err := parseExecIDs(o.execIDs)
	if err != nil {
		return fmt.Errorf("--exec-ids: %w", err)
	}
	// A Node adopted in kubernetes mode: its labels, its join token.
	kubeNode, getenv, err := o.kubeNode.start(ctx, getenv, log)
	if err != nil {
		return err
	}
	backend, err := openHardware(o.hardware, o.fakeSeed, o.stateDir)
	if err != nil {
		return err
	}
	fakeHW := strings.HasPrefix(o.hardware, "fake:") || rd != nil || mode == agentv1.AgentMode_AGENT_MODE_SITE
	if !fakeHW {
		if err := cgroups.CheckRoot(o.cgroupRoot); err != nil {
			if backend != nil {
				_ = backend.Close()
			}
			return fmt.Errorf("--cgroup-root %s: %w (only --hardware fake:… may use a plain directory)", o.cgroupRoot, err)
		}
	}
	tp, err := tracing.New(ctx, tracing.Config{Endpoint: o.otlpEndpoint, Insecure: o.otlpInsecure, ServiceName: "bcd", ServiceVersion: version,
		Getenv: getenv})
	if err != nil {
		if backend != nil {
			_ = backend.Close()
		}
		return err
	}
	defer func() {
		// Bounded: an unreachable collector must not hold up a stop.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.Warn("spans were lost at shutdown", "err", err)
		}
	}()
	// Site mode: the BMC commands' handler and the provisioning services
	// (DHCP, TFTP, HTTP) deciding each machine's boot from the control
	// plane's machine list.
	var (
		handler    agent.CommandHandler
		pxeCfg     *pxe.Config
		bmcDrivers []*agentv1.BMCDriver
	)
	if mode == agentv1.AgentMode_AGENT_MODE_SITE {
		sa, pc, err := o.siteServices(ctx, log)
		if err != nil {
			if backend != nil {
				_ = backend.Close()
			}
			return err
		}
		// Each external driver is a child process while a BMC call
		// runs; a panic or an early return must not leave one behind.
		defer driver.CleanupClients()
		handler, pxeCfg = sa, &pc
		bmcDrivers = sa.BMCDrivers()
	}
	// A node that runs instances: the hypervisor re-adopts the guests a
	// previous bcd left running before the agent says hello.
	var instances agent.InstanceRunner
	if o.inst.dir != "" {
		// Policies are enforced with nftables where the kernel and our
		// privileges allow; elsewhere only egress guests are accepted and
		// instance.network-policy is not advertised.
		np := netpolicy.New(netpolicy.Config{NetNS: o.inst.netns})
		if err := np.Reason(ctx); err != nil {
			log.Warn("network policy not enforced on this host", "reason", err)
		}
		hv, err := hypervisor.New(hypervisor.Config{StateDir: o.inst.dir, Images: o.inst.images, Bridge: o.inst.bridge,
			BridgeAddress: o.inst.bridgeAddress, NetNS: o.inst.netns, Accel: o.inst.accel, SysfsRoot: o.sysfsRoot, Logger: log,
			NetPolicy: np})
		if err == nil {
			err = hv.Start(ctx)
		}
		if err != nil {
			if backend != nil {
				_ = backend.Close()
			}
			return fmt.Errorf("--instances-dir: %w", err)
		}
		instances = hv
		// Guests of memory-overcommitting pools give memory back under
		// host pressure (docs/instances.md).
		if b := hv.Balloons(); b != nil {
			go func() { _ = b.Run(ctx) }()
		}
	}
	kube, err := o.kube.start(ctx, kubeNode, log)
	if err != nil {
		if backend != nil {
			_ = backend.Close()
		}
		return fmt.Errorf("--kubernetes: %w", err)
	}
	defer func() { _ = kube.Stop() }()
	a, err := agent.New(agent.Config{
		Kube: kube.Set, KubeHolders: kube.Holders,
		Server: o.server, StateDir: o.stateDir, Hardware: backend, SysfsRoot: o.sysfsRoot,
		CgroupRoot: o.cgroupRoot, PlainCgroupDir: fakeHW, Logger: log, Version: version, Mode: mode, Ramdisk: rd,
		HeartbeatInterval: o.heartbeat, HelloTimeout: o.helloTimeout, KeepaliveTime: o.keepalive,
		Tracing: tp, Commands: handler, BMCDrivers: bmcDrivers, Instances: instances, ExecIDFirst: execFirst, ExecIDCount: execCount,
		Attest: o.attest, ReleaseKeys: releaseKeys, NodeLabels: kubeNode.labels(), NodeLabelsChanged: kubeNode.changed(), NodeLabelsSource: kubeNode.labelsSource(),
	})
	if err != nil {
		if backend != nil {
			_ = backend.Close()
		}
		return err
	}
	defer func() { _ = a.Close() }()
	if sa, ok := handler.(*site.Agent); ok {
		// Images come over the agent's own mTLS connection.
		sa.SetFetch(a.FetchSiteImage)
	}

	if !a.Joined() {
		token, err := readToken(getenv, stdin, o.tokenStdin)
		if err != nil {
			return err
		}
		token = cmp.Or(token, boot.Token)
		if token == "" {
			return errors.New("not joined yet: provide the join token in BCD_JOIN_TOKEN or on stdin with --token-stdin")
		}
		if err := a.Join(ctx, token); err != nil {
			return err
		}
		if o.tokenEnvFile != "" {
			// The token is single-use; do not leave it on disk.
			if err := os.Remove(o.tokenEnvFile); err != nil && !errors.Is(err, os.ErrNotExist) {
				log.Warn("remove token file", "path", o.tokenEnvFile, "err", err)
			}
		}
	}

	if o.metricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", a.MetricsHandler())
		srv := &http.Server{Addr: o.metricsListen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics listener", "err", err)
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	if pxeCfg != nil {
		srv, err := pxe.New(*pxeCfg)
		if err != nil {
			return err
		}
		if err := srv.Start(ctx); err != nil {
			return err
		}
		defer func() { _ = srv.Close() }()
		if sa, ok := handler.(*site.Agent); ok {
			sa.SetPrefetch(srv.Prefetch)
		}
	}
	log.Info("bcd running", "node_id", a.NodeID(), "server", o.server, "version", version)
	// On SIGTERM (or SIGINT) Run says goodbye to the gateway, which marks
	// the node unreachable at once, and returns.
	stopping := context.AfterFunc(ctx, func() { log.Info("bcd stopping", "cause", context.Cause(ctx)) })
	defer stopping()
	if err := a.Run(ctx); err != nil {
		return err
	}
	log.Info("bcd stopped")
	return nil
}

func readToken(getenv func(string) string, stdin io.Reader, fromStdin bool) (string, error) {
	if fromStdin {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("read token from stdin: %w", err)
		}
		return strings.TrimSpace(line), nil
	}
	return strings.TrimSpace(getenv("BCD_JOIN_TOKEN")), nil
}

// logLevel is a level newLogger already accepted.
func logLevel(level string) slog.Level {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return l
}

func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func parseMode(s string) (agentv1.AgentMode, error) {
	switch s {
	case "", "node":
		return agentv1.AgentMode_AGENT_MODE_NODE, nil
	case "site":
		return agentv1.AgentMode_AGENT_MODE_SITE, nil
	case "ramdisk":
		return agentv1.AgentMode_AGENT_MODE_RAMDISK, nil
	}
	return 0, fmt.Errorf("mode %q: want node, site or ramdisk", s)
}

// openHardware parses --hardware: nvml, or fake:MODEL[:FIXTURE] where
// FIXTURE is a JSON topology file (see hw/fake.Topology).
func openHardware(spec, seed, stateDir string) (hw.Backend, error) {
	switch {
	case spec == "none":
		return nil, nil
	case spec == "nvml":
		b, err := nvml.New()
		if err != nil {
			return nil, fmt.Errorf("--hardware nvml: %w", err)
		}
		return b, nil
	case strings.HasPrefix(spec, "fake:"):
		model, fixture, _ := strings.Cut(strings.TrimPrefix(spec, "fake:"), ":")
		var topo fake.Topology
		if fixture != "" {
			t, err := fake.LoadTopology(fixture)
			if err != nil {
				return nil, err
			}
			topo = t
		}
		if seed == "" {
			// Each state dir is its own fake machine.
			abs, _ := filepath.Abs(stateDir)
			seed = abs
		}
		return fake.New(fake.Options{Model: model, Seed: seed, Topology: topo})
	}
	return nil, fmt.Errorf("--hardware %q: want nvml, none or fake:dgxh100|dgxa100|dgxb200[:FIXTURE]", spec)
}
