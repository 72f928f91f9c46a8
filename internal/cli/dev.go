package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	bcapp "github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/pki"
)

func newDevCommand() *cobra.Command {
	var f serverFlags
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
commands talk to it. Restarting keeps all state.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.roles = []string{bcapp.RoleAPI, bcapp.RoleWorker, bcapp.RoleGateway}
			logger, err := f.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if f.secret, err = devSecret(f.stateDir); err != nil {
				return err
			}
			ctx := cmd.Context()
			a, err := bcapp.New(ctx, f.config(logger))
			if err != nil {
				return serverError(err)
			}
			defer closeApp(a, logger)
			keyFile := filepath.Join(f.stateDir, "admin.key")
			secret, created, err := a.Bootstrap(ctx, func(secret string) error {
				// The database is new, so a key file left from an older one is
				// stale: replace it.
				return writeSecretFile(keyFile, secret, true)
			})
			if err != nil {
				return serverError(fmt.Errorf("bootstrap the platform: %w", err))
			}
			if !created {
				b, err := os.ReadFile(keyFile)
				if err != nil {
					return fmt.Errorf("the platform exists but its admin key file is unreadable (%w); start with a fresh --state-dir", err)
				}
				secret = strings.TrimSpace(string(b))
			}
			gwAddr, err := a.ListenGateway()
			if err != nil {
				return serverError(err)
			}
			ln, err := a.Listen()
			if err != nil {
				return serverError(err)
			}
			api := "http://" + ln.Addr().String()
			cfgPath := cmd.Flag("config").Value.String()
			if cfgPath == "" {
				cfgPath = ConfigPath()
			}
			cfg, err := LoadConfig(cfgPath)
			if err != nil {
				return err
			}
			cfg.Upsert(Context{Name: "dev", Server: api, Token: secret}, true)
			if err := cfg.Save(cfgPath); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "API: %s\n", api)
			fmt.Fprintf(out, "gateway: %s\n", gwAddr.String())
			if created {
				fmt.Fprintf(out, "admin key: %s\n", secret)
				fmt.Fprintf(out, "  (shown once; also kept in %s, mode 0600)\n", keyFile)
			} else {
				fmt.Fprintf(out, "admin key: in %s (mode 0600)\n", keyFile)
			}
			fmt.Fprintf(out, "CLI context \"dev\" written to %s; try: better-compute tenants list\n", cfgPath)
			return serverError(ignoreCanceled(a.Run(ctx, ln)))
		},
	}
	f.register(cmd, false)
	return cmd
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
