package cli

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/server"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/storeopen"
)

func init() {
	register(newPKICommand)
}

// pkiFlags are what every pki subcommand needs to reach the database.
type pkiFlags struct {
	server      serverFlags
	databaseURL string
}

func (f *pkiFlags) register(cmd *cobra.Command) {
	f.server.register(cmd, false)
	cmd.Flags().StringVar(&f.databaseURL, "database-url", envOr("BETTER_COMPUTE_DATABASE_URL", ""), "PostgreSQL URL (postgres://…); empty uses SQLite in --state-dir (env BETTER_COMPUTE_DATABASE_URL)")
}

// open opens and migrates the pki tables of the database serve uses.
func (f *pkiFlags) open(ctx context.Context) (*store.DB, error) {
	db, err := storeopen.Open(ctx, store.Config{URL: f.databaseURL, StateDir: f.server.StateDir})
	if err != nil {
		return nil, server.Unavailable(err)
	}
	if err := db.Migrate(ctx, pki.Migrations()); err != nil {
		_ = db.Close()
		return nil, server.Unavailable(err)
	}
	return db, nil
}

// sealer reads the sealing secret: BETTER_COMPUTE_SECRET, else the file dev
// writes in the state directory.
func (f *pkiFlags) sealer() (*pki.Sealer, error) {
	s, err := pki.LoadSealer(nil, f.server.StateDir)
	if err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return s, nil
}

// pkiError labels the authority's state errors as failed preconditions and
// leaves the rest (database trouble is already UNAVAILABLE) to printError.
func pkiError(err error) error {
	var ce *connect.Error
	switch {
	case err == nil || errors.As(err, &ce):
		return err
	case errors.Is(err, pki.ErrInvalidTrustDomain):
		return invalidArg("trust-domain", err.Error())
	case errors.Is(err, pki.ErrNotInitialized):
		// Most often pki looked at another database than serve's (a
		// default --state-dir, no --database-url): say so before init.
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("this database has no PKI: give pki the --database-url "+
			"(or --state-dir) serve runs with; a new deployment creates one with `better-compute pki init`"))
	case errors.Is(err, pki.ErrAlreadyInitialized), errors.Is(err, pki.ErrSealed), errors.Is(err, os.ErrExist):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

func newPKICommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pki",
		Short: "Set up and inspect the fleet's certificate authority (runs against the database)",
		Long: `pki manages the certificate authority that nodes and the gateway use. Like
serve, it works on the database directly (--state-dir or --database-url),
not through the API. CA keys are sealed with the secret in
` + pki.SecretEnv + ` (else <state-dir>/` + pki.SecretFile + `, as dev creates it).`,
	}
	cmd.AddCommand(newPKIInitCommand(), newPKIShowCommand(), newPKIIssueGatewayCommand(), newPKIRotateCommand(), newPKIStatusCommand(),
		newPKIRotateWorkloadKeyCommand())
	return cmd
}

func newPKIRotateWorkloadKeyCommand() *cobra.Command {
	var f pkiFlags
	cmd := &cobra.Command{
		Use:   "rotate-workload-key",
		Short: "Make a new key for workload tokens; the JWKS keeps the previous one",
		Long: `rotate-workload-key makes a new ES256 key that signs workload tokens from now
on, and prints its kid. The JWKS keeps the newest two keys, so tokens signed
with the previous key verify until they expire (at most an hour): do not
rotate twice within an hour. See docs/workload-identity.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			s, err := f.sealer()
			if err != nil {
				return err
			}
			db, err := f.open(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = db.Close() }()
			kid, err := pki.NewWorkloadKeys(db, s).Rotate(ctx)
			if err != nil {
				return pkiError(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "workload key: %s\n", kid)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newPKIInitCommand() *cobra.Command {
	var (
		f    pkiFlags
		opts pki.InitOptions
	)
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create the root, node, serving and internal CAs",
		Long: `init creates a 10-year root and 2-year node, serving and internal CAs, and
stores them with their keys sealed, and the command-signing root (its own
key) with the CA that certifies the replicas' worker keys. It refuses when
the database already has a CA. With --offline-root the root key is written
to --root-out/root.key (mode 0600) next to root.crt, and the command-signing
root's to command-root-1.key, and neither is stored: keep them offline.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.OfflineRoot && opts.RootOut == "" {
				return invalidArg("root-out", "required with --offline-root")
			}
			if !opts.OfflineRoot && opts.RootOut != "" {
				return invalidArg("root-out", "only with --offline-root")
			}
			s, err := f.sealer()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			db, err := f.open(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = db.Close() }()
			a, err := pki.Init(ctx, db, s, opts)
			if err != nil {
				return pkiError(err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "trust domain: %s\n", a.TrustDomain())
			if opts.OfflineRoot {
				fmt.Fprintf(out, "root key: %s (mode 0600; not stored: keep it offline)\n", filepath.Join(opts.RootOut, "root.key"))
				fmt.Fprintf(out, "command-signing root key: %s (mode 0600; not stored: keep it offline)\n", filepath.Join(opts.RootOut, "command-root-1.key"))
			}
			fmt.Fprintf(out, "pin: %s\n", a.Pin())
			return nil
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&opts.TrustDomain, "trust-domain", pki.DefaultTrustDomain, "SPIFFE trust domain of node identities (a DNS name)")
	fl.BoolVar(&opts.OfflineRoot, "offline-root", false, "do not store the root key; write it to --root-out")
	fl.StringVar(&opts.RootOut, "root-out", "", "directory for root.crt and root.key with --offline-root")
	return cmd
}

func newPKIShowCommand() *cobra.Command {
	var f pkiFlags
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Print the trust domain, the CAs and the pin agents need",
		Long: `show prints the trust domain, each CA's subject and expiry, and the pin: the
SHA-256 of the root's public key, which join tokens carry and agents check.
It needs no secret.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			db, err := f.open(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = db.Close() }()
			sum, err := pki.Inspect(ctx, db)
			if err != nil {
				return pkiError(err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "trust domain: %s\n", sum.TrustDomain)
			for _, ca := range sum.CAs {
				note := ""
				if ca.Offline {
					note = " (key offline)"
				}
				if ca.Generation != sum.ServingGeneration {
					note += fmt.Sprintf(" (generation %d, published by pki rotate)", ca.Generation)
				}
				fmt.Fprintf(out, "%-12s %s, expires %s%s\n", ca.Kind+" CA:", ca.Subject, stamp(ca.NotAfter), note)
			}
			for _, r := range sum.CommandRoots {
				note := ""
				if r.Offline {
					note += " (key offline)"
				}
				if r.Retired {
					note += " (retired)"
				}
				fmt.Fprintf(out, "command-signing root v%d: %s, expires %s%s\n", r.Version, r.Subject, stamp(r.NotAfter), note)
			}
			fmt.Fprintf(out, "pin: %s\n", sum.Pin)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newPKIIssueGatewayCommand() *cobra.Command {
	var (
		f     pkiFlags
		hosts []string
		out   string
	)
	cmd := &cobra.Command{
		Use:   "issue-gateway",
		Short: "Issue the gateway's serving certificate",
		Long: `issue-gateway issues a 90-day serving certificate for a fresh key, with the
given hosts (DNS names or IP addresses) as SANs, and writes --out/gateway.crt
(leaf, serving CA and root, PEM) and --out/gateway.key (mode 0600),
replacing earlier ones.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(hosts) == 0 {
				return invalidArg("host", "at least one --host is required")
			}
			if out == "" {
				return invalidArg("out", "required: the directory for gateway.crt and gateway.key")
			}
			s, err := f.sealer()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			db, err := f.open(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = db.Close() }()
			a, err := pki.Load(ctx, db, s, clock.Real{})
			if err != nil {
				return pkiError(err)
			}
			cert, err := a.IssueServing(hosts)
			if err != nil {
				return invalidArg("host", err.Error())
			}
			var chain []byte
			for _, der := range cert.Certificate {
				chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
			}
			keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
			if err != nil {
				return pkiError(err)
			}
			keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
			defer clear(keyPEM)
			clear(keyDER)
			if err := os.MkdirAll(out, 0o700); err != nil {
				return err
			}
			crtPath, keyPath := filepath.Join(out, "gateway.crt"), filepath.Join(out, "gateway.key")
			// The key first: a new certificate next to an old key would not load.
			if err := replaceFile(keyPath, keyPEM, 0o600); err != nil {
				return err
			}
			if err := replaceFile(crtPath, chain, 0o644); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "certificate: %s (expires %s)\n", crtPath, stamp(cert.Leaf.NotAfter))
			fmt.Fprintf(w, "key: %s (mode 0600)\n", keyPath)
			fmt.Fprintf(w, "pin: %s\n", a.Pin())
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringArrayVar(&hosts, "host", nil, "DNS name or IP address agents dial the gateway at (repeatable)")
	cmd.Flags().StringVar(&out, "out", "", "directory to write gateway.crt and gateway.key to")
	return cmd
}

// replaceFile writes data to path atomically with mode, so a reader never
// sees a half-written key and the key is never readable by others, even
// briefly.
func replaceFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
