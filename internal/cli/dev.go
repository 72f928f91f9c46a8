package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	bcapp "github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/tracing"
)

func newDevCommand() *cobra.Command {
	var (
		f          serverFlags
		simNodes   int
		simMachs   int
		simProfile string
		simCgroups string
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run every role in one process on SQLite, for development",
		Long: `dev runs the whole control plane in one process with the embedded SQLite
store in --state-dir. The first start creates the platform and prints the
admin API key once (it is also kept in <state-dir>/admin.key, mode 0600);
the agent gateway listens on --gateway-listen with a development PKI sealed
by BETTER_COMPUTE_SECRET, or else by a secret generated once into
<state-dir>/secret (mode 0600);
every start writes a CLI context named "dev" so that plain better-compute
commands talk to it. Restarting keeps all state.

--sim-machines N adds N simulated bare-metal machines (sim-m1…) at site
sim-site of tenant sim: Redfish BMC emulators on loopback behind an
in-process site agent that plays each machine's ramdisk, and a signed raw
image "sample", so commission → deploy --image sample → release runs in
seconds without QEMU. Their BMC addresses and logins live in
<state-dir>/sim-machines.json (mode 0600), so a restart brings the same
machines back.

--sim-nodes N runs N simulated GPU hosts in the same process: the real agent
code on go-nvml's DGX mocks, joining through the gateway over loopback mTLS
into tenant "sim", project "nodes". Their identities live in
<state-dir>/sim, so a restart brings the same nodes back. With
--sim-cgroups real (or auto, the default, where this process may) their
allocations are real cgroups under the machine's cgroup2 mount
(bettercompute-dev/) with the real BPF device filter, so reservations exec
runs processes inside them; plain keeps them in ordinary directories.

A port in use stops the start before anything is created; the error names
the flag to pass (--listen, --gateway-listen; 127.0.0.1:0 picks a free port
and the "dev" context follows it). The admin key is printed by the first
start that succeeds. To try node loss without waiting five minutes, shorten
the liveness timeouts: --heartbeat-interval 2s --unreachable-after 5s
--lost-after 15s.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.roles = []string{bcapp.RoleAPI, bcapp.RoleWorker, bcapp.RoleGateway}
			if simNodes < 0 || simNodes > 1000 {
				return invalidArg("sim-nodes", "must be between 0 and 1000")
			}
			if simMachs < 0 || simMachs > 1000 {
				return invalidArg("sim-machines", "must be between 0 and 1000")
			}
			profiles, err := bctest.ParseProfiles(simProfile)
			if err != nil {
				return invalidArg("sim-profile", err.Error())
			}
			switch simCgroups {
			case "auto", "real", "plain":
			default:
				return invalidArg("sim-cgroups", "must be auto, real or plain, got "+simCgroups)
			}
			if err := f.checkLiveness(); err != nil {
				return err
			}
			logger, err := f.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if f.secret, err = devSecret(f.stateDir); err != nil {
				return err
			}
			ctx := cmd.Context()
			appCfg := f.config(logger)
			// dev's receivers run on this machine: loopback endpoints are
			// allowed (the API's own listener still is not).
			appCfg.WebhookAllowLoopback = true
			a, err := bcapp.New(ctx, appCfg)
			if err != nil {
				return serverError(err)
			}
			defer closeApp(a, logger)
			// Bind before bootstrapping: a start that cannot serve must not
			// create the key it would then never show.
			ln, gwAddr, err := f.bind(a, true, true)
			if err != nil {
				return err
			}
			keyFile := filepath.Join(f.stateDir, "admin.key")
			// shownFile marks the key as printed, so that a start failing
			// between bootstrap and printing leaves it for the next start.
			shownFile := keyFile + ".shown"
			secret, created, err := a.Bootstrap(ctx, func(secret string) error {
				// The database is new, so a key file (and its marker) left
				// from an older one is stale: replace it.
				if err := os.Remove(shownFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
				return writeSecretFile(keyFile, secret, true)
			})
			if err != nil {
				_ = ln.Close()
				return serverError(fmt.Errorf("bootstrap the platform: %w", err))
			}
			if !created {
				b, err := os.ReadFile(keyFile)
				if err != nil {
					_ = ln.Close()
					return fmt.Errorf("the platform exists but its admin key file is unreadable (%w); start with a fresh --state-dir", err)
				}
				secret = strings.TrimSpace(string(b))
			}
			_, err = os.Stat(shownFile)
			showKey := errors.Is(err, fs.ErrNotExist)
			api := "http://" + ln.Addr().String()
			cfgPath := cmd.Flag("config").Value.String()
			if cfgPath == "" {
				cfgPath = ConfigPath()
			}
			cfg, err := LoadConfig(cfgPath)
			if err != nil {
				_ = ln.Close()
				return err
			}
			devCtx := Context{Name: "dev", Server: api, Token: secret}
			if simNodes > 0 || simMachs > 0 {
				// The simulated nodes and machines live in tenant sim:
				// tenant-side verbs (pools, reserve, machines) default to it.
				devCtx.Tenant = "sim"
			}
			cfg.Upsert(devCtx, true)
			if err := cfg.Save(cfgPath); err != nil {
				_ = ln.Close()
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "API: %s\n", api)
			fmt.Fprintf(out, "gateway: %s\n", gwAddr.String())
			if showKey {
				fmt.Fprintf(out, "admin key: %s\n", secret)
				fmt.Fprintf(out, "  (shown once; also kept in %s, mode 0600)\n", keyFile)
				if err := writeSecretFile(shownFile, "", true); err != nil {
					return fmt.Errorf("mark the admin key as shown: %w", err)
				}
			} else {
				fmt.Fprintf(out, "admin key: in %s (mode 0600)\n", keyFile)
			}
			fmt.Fprintf(out, "CLI context \"dev\" written to %s; try: better-compute tenants list\n", cfgPath)
			if simNodes == 0 && simMachs == 0 {
				return serverError(ignoreCanceled(a.Run(ctx, ln)))
			}
			// The simulated nodes stop before the gateway, so their sessions
			// end cleanly instead of reconnecting into a shutdown.
			appCtx, stopApp := context.WithCancel(context.WithoutCancel(ctx))
			defer stopApp()
			runErr := make(chan error, 1)
			go func() { runErr <- a.Run(appCtx, ln) }()
			if simMachs > 0 {
				site, err := startSimMachines(ctx, a.Metal, api, secret, f.stateDir, simMachs)
				if err != nil {
					stopApp()
					return errors.Join(serverError(fmt.Errorf("start %d simulated machines: %w", simMachs, err)), ignoreCanceled(<-runErr))
				}
				defer site.Close()
				fmt.Fprintf(out, "sim: %d simulated machines (sim-m1…sim-m%d, Redfish BMCs on loopback) at site %s in tenant sim; signed image %s\n",
					simMachs, simMachs, DevSite, DevSampleImage)
				fmt.Fprintf(out, "  try: better-compute machines commission sim-m1; better-compute machines deploy sim-m1 --image %s; better-compute machines release sim-m1\n",
					DevSampleImage)
			}
			if simNodes == 0 {
				select {
				case <-ctx.Done():
				case err := <-runErr:
					return serverError(ignoreCanceled(err))
				}
				stopApp()
				return serverError(ignoreCanceled(<-runErr))
			}
			cgroupRoot := ""
			if simCgroups != "plain" {
				root, err := bctest.RealCgroupRoot("bettercompute-dev")
				switch {
				case err == nil:
					cgroupRoot = root
				case simCgroups == "real":
					stopApp()
					return errors.Join(invalidArg("sim-cgroups", "real cgroups: "+err.Error()), ignoreCanceled(<-runErr))
				default:
					logger.Info("simulated nodes keep plain cgroup directories", "reason", err)
				}
			}
			sim, err := startSim(ctx, api, secret, gwAddr.String(), f.stateDir, simNodes, profiles, cgroupRoot, logger, a.Tracing)
			if err != nil {
				stopApp()
				return errors.Join(serverError(fmt.Errorf("start %d simulated nodes: %w", simNodes, err)), ignoreCanceled(<-runErr))
			}
			fmt.Fprintf(out, "sim: %d simulated nodes (%s) in tenant sim, project nodes; pool %s offered to all tenants; platform flavor %s and ip pool %s\n", simNodes,
				cmp.Or(strings.Join(profiles, ","), "dgxh100"), DevPool, DevFlavor, DevIPPool)
			if err := devSandboxTemplate(ctx, client.New(api, secret)); err != nil {
				sim.Stop()
				stopApp()
				return errors.Join(serverError(fmt.Errorf("ship sandbox template %s: %w", DevSandboxTemplate, err)), ignoreCanceled(<-runErr))
			}
			fmt.Fprintf(out, "sandbox template %s in tenant sim (flavor %s, pool %s); try: better-compute sandboxes create --template %s --wait 1m\n",
				DevSandboxTemplate, DevFlavor, DevPool, DevSandboxTemplate)
			select {
			case <-ctx.Done():
			case err := <-runErr:
				sim.Stop()
				return serverError(ignoreCanceled(err))
			}
			sim.Stop()
			stopApp()
			return serverError(ignoreCanceled(<-runErr))
		},
	}
	f.register(cmd, false)
	cmd.Flags().IntVar(&simNodes, "sim-nodes", 0, "run N simulated GPU hosts (8 GPUs each for dgxh100) that join through the gateway")
	cmd.Flags().IntVar(&simMachs, "sim-machines", 0, "run N simulated bare-metal machines (Redfish BMCs on loopback) at site sim-site, with a signed image sample")
	cmd.Flags().StringVar(&simCgroups, "sim-cgroups", "auto", "simulated nodes' allocations: real cgroups (real), plain directories (plain), or real where permitted (auto)")
	cmd.Flags().StringVar(&simProfile, "sim-profile", "dgxh100", "simulated host mix, round-robin: dgxh100, dgxa100, dgxb200 (comma-separated)")
	return cmd
}

// startSim ensures the sim tenant and project exist, then starts the fleet
// in <stateDir>/sim; nodes that joined on an earlier start reuse their
// identity and take no token. No process of a reservation and no guest's
// command reaches stateDir (the admin key, the database).
func startSim(ctx context.Context, api, adminKey, gateway, stateDir string, n int, profiles []string, cgroupRoot string, logger *slog.Logger, tp *tracing.Provider) (*bctest.FleetSim, error) {
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(stateDir, "sim")
	c := client.New(api, adminKey)
	if err := ensureSimTenant(ctx, c); err != nil {
		return nil, err
	}
	if _, err := c.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "sim", Project: "nodes"})); client.Code(err) == "NOT_FOUND" {
		if _, err := c.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "sim", Name: "nodes"})); err != nil && client.Code(err) != "ALREADY_EXISTS" {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	// The simulated fleet is the operator's: its H100 nodes form pool h100,
	// offered to every tenant, so a tenant the platform creates can reserve
	// from it within the quota it is given.
	if _, err := c.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "sim", Pool: DevPool})); client.Code(err) == "NOT_FOUND" {
		_, err := c.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "sim", Name: DevPool,
			Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: pool.OpIn, Values: []string{"H100"}}}}))
		if err != nil && client.Code(err) != "ALREADY_EXISTS" {
			return nil, err
		}
		if _, err := c.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "sim", Pool: DevPool, To: []string{pool.OfferAll}})); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if err := devInstanceCatalog(ctx, c); err != nil {
		return nil, err
	}
	return bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		// The simulated nodes trace with the control plane's provider, so
		// a dev trace runs into the agent as a real node's would.
		Template: bctest.FakeDaemonConfig{Gateway: gateway, Logger: logger.With("component", "sim"), CgroupRoot: cgroupRoot, Tracing: tp.IfEnabled(),
			Hide: []string{stateDir}},
		Root:     root,
		N:        n,
		Profiles: profiles,
		Token: func(ctx context.Context, _ int) (string, error) {
			res, err := c.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "sim", Project: "nodes", TtlSeconds: 600}))
			if err != nil {
				return "", err
			}
			return res.Msg.GetToken(), nil
		},
	})
}

// DevPool is the pool of the simulated fleet's H100 nodes that dev offers
// to every tenant.
const DevPool = "h100"

// The platform's flavor and IP pool dev ships, so a newcomer has a size and
// addresses for guests without setting them up first.
const (
	DevFlavor = "small"
	DevIPPool = "dev"
)

// devInstanceCatalog ensures the platform's default flavor and IP pool;
// on a restart both exist and nothing is written.
func devInstanceCatalog(ctx context.Context, c *client.Client) error {
	if _, err := c.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Flavor: DevFlavor})); client.Code(err) == "NOT_FOUND" {
		_, err := c.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Name: DevFlavor, Vcpus: 2, MemoryMib: 2048, DiskGib: 10,
			Description: "dev's default: 2 vCPUs, 2 GiB, 10 GiB disk"}))
		if err != nil && client.Code(err) != "ALREADY_EXISTS" {
			return err
		}
	} else if err != nil {
		return err
	}
	if _, err := c.IPPools.Get(ctx, connect.NewRequest(&apiv1.GetIPPoolRequest{IpPool: DevIPPool})); client.Code(err) == "NOT_FOUND" {
		_, err := c.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: DevIPPool, Cidr: "10.100.0.0/24",
			Dns: []string{"10.100.0.1"}, Network: "sim", Description: "dev's default: the simulated hosts' guest network"}))
		if err != nil && client.Code(err) != "ALREADY_EXISTS" {
			return err
		}
	} else if err != nil {
		return err
	}
	return nil
}

// DevSandboxTemplate is the sandbox template dev ships in tenant sim.
const DevSandboxTemplate = "default"

// devSandboxTemplate ensures tenant sim's default sandbox template (dev's
// flavor, pool and IP pool, one warm instance). A template is checked
// against its pool's hosts, so on a first start it waits for the
// simulated hosts' inventory to arrive; on a restart it exists and
// nothing is written.
func devSandboxTemplate(ctx context.Context, c *client.Client) error {
	_, err := c.SandboxTemplates.Get(ctx, connect.NewRequest(&apiv1.GetSandboxTemplateRequest{Tenant: "sim", Template: DevSandboxTemplate}))
	if client.Code(err) != "NOT_FOUND" {
		return err
	}
	req := &apiv1.CreateSandboxTemplateRequest{Tenant: "sim", Name: DevSandboxTemplate, Flavor: DevFlavor, Pool: DevPool, IpPool: DevIPPool,
		WarmMin: 1, WarmMax: 2}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := c.SandboxTemplates.Create(ctx, connect.NewRequest(req))
		switch code := client.Code(err); {
		case err == nil, code == "ALREADY_EXISTS":
			return nil
		case (code == "NO_CAPACITY" || code == "FAILED_PRECONDITION") && time.Now().Before(deadline):
			// The hosts' inventory is not in yet.
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// devSecret returns BETTER_COMPUTE_SECRET, else the secret in
// <state-dir>/secret, generating it (mode 0600) on the first start so that
// restarts open the same PKI.
func devSecret(stateDir string) (string, error) {
	if v := strings.TrimSpace(os.Getenv(pki.SecretEnv)); v != "" {
		return v, nil
	}
	path := filepath.Join(stateDir, pki.SecretFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		fi, err := os.Stat(path)
		if err != nil {
			return "", err
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("%s is readable by others (mode %v): chmod 600 it", path, fi.Mode().Perm())
		}
		return strings.TrimSpace(string(b)), nil
	case !errors.Is(err, os.ErrNotExist):
		return "", err
	}
	secret, err := pki.GenerateSecret()
	if err != nil {
		return "", err
	}
	if err := writeSecretFile(path, secret, false); err != nil {
		return "", fmt.Errorf("keep the generated secret: %w", err)
	}
	return secret, nil
}
