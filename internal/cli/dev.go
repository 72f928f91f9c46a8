package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/internal/console"
	"github.com/better-compute/better-compute/internal/devrig"
	"github.com/better-compute/better-compute/internal/pki"
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
			o := devrig.Options{Server: f.options(), Nodes: simNodes, Machines: simMachs, Profile: simProfile, Cgroups: simCgroups}
			o.Server.Secret = os.Getenv(pki.SecretEnv)
			ctx := cmd.Context()
			rig, err := devrig.Open(ctx, o, cmd.ErrOrStderr())
			if err != nil {
				return optionError(err)
			}
			defer rig.Close()
			cfgPath := cmd.Flag("config").Value.String()
			if cfgPath == "" {
				cfgPath = ConfigPath()
			}
			cfg, err := LoadConfig(cfgPath)
			if err != nil {
				return err
			}
			devCtx := Context{Name: "dev", Server: rig.API, Token: rig.AdminKey}
			if simNodes > 0 || simMachs > 0 {
				// The simulated nodes and machines live in tenant sim:
				// tenant-side verbs (pools, reserve, machines) default to it.
				devCtx.Tenant = devrig.Tenant
			}
			cfg.Upsert(devCtx, true)
			if err := cfg.Save(cfgPath); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "API: %s\n", rig.API)
			fmt.Fprintf(out, "gateway: %s\n", rig.Gateway)
			fmt.Fprintf(out, "console: %s%s (sign in with an API key)\n", rig.API, console.Path)
			if rig.ShowKey {
				fmt.Fprintf(out, "admin key: %s\n", rig.AdminKey)
				fmt.Fprintf(out, "  (shown once; also kept in %s, mode 0600)\n", rig.KeyFile)
				if err := rig.MarkKeyShown(); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(out, "admin key: in %s (mode 0600)\n", rig.KeyFile)
			}
			fmt.Fprintf(out, "CLI context \"dev\" written to %s; try: better-compute tenants list\n", cfgPath)
			return optionError(rig.Run(ctx, out))
		},
	}
	f.register(cmd, false)
	cmd.Flags().IntVar(&simNodes, "sim-nodes", 0, "run N simulated GPU hosts (8 GPUs each for dgxh100) that join through the gateway")
	cmd.Flags().IntVar(&simMachs, "sim-machines", 0, "run N simulated bare-metal machines (Redfish BMCs on loopback) at site sim-site, with a signed image sample")
	cmd.Flags().StringVar(&simCgroups, "sim-cgroups", "auto", "simulated nodes' allocations: real cgroups (real), plain directories (plain), or real where permitted (auto)")
	cmd.Flags().StringVar(&simProfile, "sim-profile", "dgxh100", "simulated host mix, round-robin: dgxh100, dgxa100, dgxb200 (comma-separated)")
	return cmd
}
