package devrig

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	bcapp "github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/server"
)

// Options are dev's settings: the server's, and what to simulate beside it.
type Options struct {
	// Server holds the flags dev shares with serve; Roles is ignored (dev
	// runs every role) and Secret, when empty, comes from
	// <state-dir>/secret.
	Server server.Options
	// Nodes is how many simulated GPU hosts join through the gateway, and
	// Machines how many simulated bare-metal machines sit at site sim-site.
	Nodes, Machines int
	// Profile is the simulated host mix, comma-separated, round-robin.
	Profile string
	// Cgroups is where the simulated nodes' allocations live: real
	// cgroups (real), plain directories (plain), or real where permitted
	// (auto).
	Cgroups string
}

// A Rig is a dev process bound and bootstrapped but not yet serving: the
// caller reports the API and the admin key, then calls Run. A start that
// cannot serve fails in Open, before the key is created.
type Rig struct {
	// API is the API's URL and Gateway the agent gateway's address.
	API, Gateway string
	// AdminKey is the platform's first admin key, kept in KeyFile (mode
	// 0600). ShowKey says no start has shown it yet (MarkKeyShown records
	// that one did).
	AdminKey, KeyFile string
	ShowKey           bool

	o        Options
	profiles []string
	logger   *slog.Logger
	app      *bcapp.App
	ln       net.Listener
	served   bool
	closed   bool
}

// Open checks o, opens the app on the state directory, binds its listeners
// and bootstraps an empty database, its admin key written to
// <state-dir>/admin.key. A refused setting is a *server.FlagError. The
// caller must Close the rig.
func Open(ctx context.Context, o Options, logw io.Writer) (*Rig, error) {
	o.Server.Roles = []string{bcapp.RoleAPI, bcapp.RoleWorker, bcapp.RoleGateway}
	if o.Nodes < 0 || o.Nodes > 1000 {
		return nil, &server.FlagError{Flag: "sim-nodes", Reason: "must be between 0 and 1000"}
	}
	if o.Machines < 0 || o.Machines > 1000 {
		return nil, &server.FlagError{Flag: "sim-machines", Reason: "must be between 0 and 1000"}
	}
	profiles, err := bctest.ParseProfiles(o.Profile)
	if err != nil {
		return nil, &server.FlagError{Flag: "sim-profile", Reason: err.Error()}
	}
	switch o.Cgroups {
	case "auto", "real", "plain":
	default:
		return nil, &server.FlagError{Flag: "sim-cgroups", Reason: "must be auto, real or plain, got " + o.Cgroups}
	}
	if err := o.Server.CheckLiveness(); err != nil {
		return nil, err
	}
	logger, err := o.Server.Logger(logw)
	if err != nil {
		return nil, err
	}
	if o.Server.Secret, err = devSecret(o.Server.StateDir, o.Server.Secret); err != nil {
		return nil, err
	}
	appCfg := o.Server.AppConfig(logger)
	// dev's receivers run on this machine: loopback endpoints are
	// allowed (the API's own listener still is not).
	appCfg.WebhookAllowLoopback = true
	a, err := bcapp.New(ctx, appCfg)
	if err != nil {
		return nil, server.Unavailable(err)
	}
	r := &Rig{o: o, profiles: profiles, logger: logger, app: a}
	// Bind before bootstrapping: a start that cannot serve must not
	// create the key it would then never show.
	ln, gwAddr, err := o.Server.Bind(a, true, true)
	if err != nil {
		r.Close()
		return nil, err
	}
	r.ln = ln
	r.KeyFile = filepath.Join(o.Server.StateDir, "admin.key")
	// shownFile marks the key as printed, so that a start failing
	// between bootstrap and printing leaves it for the next start.
	shownFile := r.shownFile()
	secret, created, err := a.Bootstrap(ctx, func(secret string) error {
		// The database is new, so a key file (and its marker) left
		// from an older one is stale: replace it.
		if err := os.Remove(shownFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return server.WriteSecretFile(r.KeyFile, secret, true)
	})
	if err != nil {
		r.Close()
		return nil, server.Unavailable(fmt.Errorf("bootstrap the platform: %w", err))
	}
	if !created {
		b, err := os.ReadFile(r.KeyFile)
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("the platform exists but its admin key file is unreadable (%w); start with a fresh --state-dir", err)
		}
		secret = strings.TrimSpace(string(b))
	}
	_, err = os.Stat(shownFile)
	r.ShowKey = errors.Is(err, fs.ErrNotExist)
	r.AdminKey = secret
	r.API = "http://" + ln.Addr().String()
	r.Gateway = gwAddr.String()
	return r, nil
}

func (r *Rig) shownFile() string { return r.KeyFile + ".shown" }

// MarkKeyShown records that the admin key was shown, so later starts only
// say where it is kept.
func (r *Rig) MarkKeyShown() error {
	if err := server.WriteSecretFile(r.shownFile(), "", true); err != nil {
		return fmt.Errorf("mark the admin key as shown: %w", err)
	}
	return nil
}

// Close releases what Open took: the listener if Run never served on it,
// and the database. It is safe to call more than once.
func (r *Rig) Close() {
	if r.closed {
		return
	}
	r.closed = true
	if r.ln != nil && !r.served {
		_ = r.ln.Close()
	}
	server.CloseApp(r.app, r.logger)
}

// Run serves every role and starts the simulated machines and nodes,
// telling out what it started, until ctx ends.
func (r *Rig) Run(ctx context.Context, out io.Writer) error {
	r.served = true
	a, ln, api, secret, logger := r.app, r.ln, r.API, r.AdminKey, r.logger
	simNodes, simMachs := r.o.Nodes, r.o.Machines
	if simNodes == 0 && simMachs == 0 {
		return server.Unavailable(server.IgnoreCanceled(a.Run(ctx, ln)))
	}
	// The simulated nodes stop before the gateway, so their sessions
	// end cleanly instead of reconnecting into a shutdown.
	appCtx, stopApp := context.WithCancel(context.WithoutCancel(ctx))
	defer stopApp()
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(appCtx, ln) }()
	if simMachs > 0 {
		site, err := startSimMachines(ctx, a.Metal, api, secret, r.o.Server.StateDir, simMachs)
		if err != nil {
			stopApp()
			return errors.Join(server.Unavailable(fmt.Errorf("start %d simulated machines: %w", simMachs, err)), server.IgnoreCanceled(<-runErr))
		}
		defer site.Close()
		fmt.Fprintf(out, "sim: %d simulated machines (sim-m1…sim-m%d, Redfish BMCs on loopback) at site %s in tenant sim; signed image %s\n",
			simMachs, simMachs, Site, SampleImage)
		fmt.Fprintf(out, "  try: better-compute machines commission sim-m1; better-compute machines deploy sim-m1 --image %s; better-compute machines release sim-m1\n",
			SampleImage)
	}
	if simNodes == 0 {
		select {
		case <-ctx.Done():
		case err := <-runErr:
			return server.Unavailable(server.IgnoreCanceled(err))
		}
		stopApp()
		return server.Unavailable(server.IgnoreCanceled(<-runErr))
	}
	cgroupRoot := ""
	if r.o.Cgroups != "plain" {
		root, err := bctest.RealCgroupRoot("bettercompute-dev")
		switch {
		case err == nil:
			cgroupRoot = root
		case r.o.Cgroups == "real":
			stopApp()
			return errors.Join(&server.FlagError{Flag: "sim-cgroups", Reason: "real cgroups: " + err.Error()}, server.IgnoreCanceled(<-runErr))
		default:
			logger.Info("simulated nodes keep plain cgroup directories", "reason", err)
		}
	}
	sim, err := StartFleet(ctx, api, secret, r.Gateway, r.o.Server.StateDir, simNodes, r.profiles, cgroupRoot, logger, a.Tracing)
	if err != nil {
		stopApp()
		return errors.Join(server.Unavailable(fmt.Errorf("start %d simulated nodes: %w", simNodes, err)), server.IgnoreCanceled(<-runErr))
	}
	fmt.Fprintf(out, "sim: %d simulated nodes (%s) in tenant sim, project nodes; pool %s offered to all tenants; platform flavor %s and ip pool %s\n", simNodes,
		cmp.Or(strings.Join(r.profiles, ","), "dgxh100"), Pool, Flavor, IPPool)
	if err := EnsureSandboxTemplate(ctx, client.New(api, secret)); err != nil {
		sim.Stop()
		stopApp()
		return errors.Join(server.Unavailable(fmt.Errorf("ship sandbox template %s: %w", SandboxTemplate, err)), server.IgnoreCanceled(<-runErr))
	}
	fmt.Fprintf(out, "sandbox template %s in tenant sim (flavor %s, pool %s); try: better-compute sandboxes create --template %s --wait 1m\n",
		SandboxTemplate, Flavor, Pool, SandboxTemplate)
	select {
	case <-ctx.Done():
	case err := <-runErr:
		sim.Stop()
		return server.Unavailable(server.IgnoreCanceled(err))
	}
	sim.Stop()
	stopApp()
	return server.Unavailable(server.IgnoreCanceled(<-runErr))
}

// devSecret returns secret (BETTER_COMPUTE_SECRET) when set, else the
// secret in <state-dir>/secret, generating it (mode 0600) on the first
// start so that restarts open the same PKI.
func devSecret(stateDir, secret string) (string, error) {
	if v := strings.TrimSpace(secret); v != "" {
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
	secret, err = pki.GenerateSecret()
	if err != nil {
		return "", err
	}
	if err := server.WriteSecretFile(path, secret, false); err != nil {
		return "", fmt.Errorf("keep the generated secret: %w", err)
	}
	return secret, nil
}
