package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
)

// openCommands is how a rotation counts open commands signed under an old
// command-signing generation: the fleet module's table.
func openCommands(ctx context.Context, tx store.Tx, version int64) (int, error) {
	return fleet.CommandOpenSignedUpTo(ctx, tx, version)
}

// loadAuthority opens the database and the authority with the sealing
// secret.
func (f *pkiFlags) loadAuthority(ctx context.Context) (*store.DB, *pki.Authority, error) {
	s, err := f.sealer()
	if err != nil {
		return nil, nil, err
	}
	db, err := f.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	// A rotation reads the fleet's nodes and commands: serve migrates
	// them too, but pki may run first.
	if err := db.Migrate(ctx, fleet.Migrations()); err != nil {
		_ = db.Close()
		return nil, nil, connect.NewError(connect.CodeUnavailable, err)
	}
	a, err := pki.Load(ctx, db, s, nil)
	if err != nil {
		_ = db.Close()
		return nil, nil, pkiError(err)
	}
	return db, a, nil
}

func newPKIRotateCommand() *cobra.Command {
	var (
		f       pkiFlags
		rootOut string
	)
	cmd := &cobra.Command{
		Use:   "rotate",
		Short: "Rotate the fleet's root and the command-signing root without an outage",
		Long: `rotate drives a trust-root rotation one step at a time; run it again until it
says the rotation is finished (it exits with FAILED_PRECONDITION while it
waits, so a script can retry it).

 1. With no rotation running, it publishes a new fleet generation (root,
    node, serving and internal CAs) and a new command-signing root beside
    the old ones. Nodes move onto them as they renew their certificates
    (at two thirds of 24 hours): each renewal hands out a certificate of the
    new generation, a trust bundle with both roots and a command bundle with
    both command roots. Nothing else changes yet; sessions stay up.
 2. Once no live node certificate of the old generation is left (every node
    renewed, or its old certificate expired or was revoked), the new
    generation serves: the gateway's and replicas' certificates come from
    it, the old root leaves the bundle, and replicas sign commands with the
    new command root. Join tokens minted before this step stop working.
 3. Once no open command and no live worker key of the old command root is
    left, the old command root is retired.

pki status shows where every node stands. With an offline root, the new
roots' keys are written to --root-out (root-<generation>.key and
command-root-<version>.key, mode 0600) and not stored.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			db, a, err := f.loadAuthority(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = db.Close() }()
			out := cmd.OutOrStdout()
			st, err := a.Rotation(ctx, openCommands)
			if err != nil {
				return pkiError(err)
			}
			if !st.InProgress() {
				if a.RootOffline() && rootOut == "" {
					return invalidArg("root-out", "required: the root is kept offline, so the new roots' keys are written there")
				}
				st, err = a.BeginRotation(ctx, rootOut)
				if err != nil {
					return pkiError(err)
				}
				fmt.Fprintf(out, "published fleet generation %d and command-signing root v%d beside generation %d and v%d\n",
					st.Newest, st.CommandPublished, st.Serving, st.CommandActive)
				fmt.Fprintln(out, "nodes move onto them as they renew their certificates; run `better-compute pki rotate` again to finish, `better-compute pki status` to follow")
				return nil
			}
			st, err = a.AdvanceRotation(ctx, openCommands)
			printRotation(out, st)
			if errors.Is(err, pki.ErrRotationWaiting) {
				return connect.NewError(connect.CodeFailedPrecondition, errors.New(waitingFor(st)))
			}
			if err != nil {
				return pkiError(err)
			}
			fmt.Fprintf(out, "rotation finished: generation %d serves and command-signing root v%d signs; the old roots are retired\n", st.Serving, st.CommandActive)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&rootOut, "root-out", "", "directory for the new roots' keys when the root is kept offline")
	return cmd
}

// waitingFor says what a rotation waits on, in one sentence.
func waitingFor(st pki.RotationStatus) string {
	switch {
	case len(st.Stragglers) > 0:
		return fmt.Sprintf("the rotation waits on %d node certificate(s) of an older generation: those nodes have not renewed yet (pki status lists them; each moves at its next renewal, or when its certificate expires or is revoked); run pki rotate again later", len(st.Stragglers))
	case st.OpenOldCommands > 0 || len(st.OldSigners) > 0:
		return fmt.Sprintf("the old command-signing root retires once %d open command(s) signed under it end and %d replica worker key(s) of it are replaced (replicas switch within 30 s); run pki rotate again later", st.OpenOldCommands, len(st.OldSigners))
	}
	return "the new roots serve; the old command-signing root retires at the next pki rotate, once every replica has reloaded the PKI (within 30 s)"
}

func printRotation(w io.Writer, st pki.RotationStatus) {
	fmt.Fprintf(w, "fleet generation: %d serves", st.Serving)
	if st.Newest > st.Serving {
		fmt.Fprintf(w, ", %d published", st.Newest)
	}
	fmt.Fprintf(w, "\ncommand-signing root: v%d signs", st.CommandActive)
	if st.CommandPublished > st.CommandActive {
		fmt.Fprintf(w, ", v%d published", st.CommandPublished)
	}
	if st.CommandOldest < st.CommandActive {
		fmt.Fprintf(w, ", v%d retiring", st.CommandOldest)
	}
	fmt.Fprintf(w, "\nrotation: %s\n", st.Phase())
}

func newPKIStatusCommand() *cobra.Command {
	var f pkiFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show where a root rotation stands and where every node stands in it",
		Long: `status prints the serving and published generations, and for every node with a
live certificate: the generation that issued it, when it expires, the
command-signing version the node reported at its last session start, and
whether it still holds a rotation back. It needs the sealing secret.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			db, a, err := f.loadAuthority(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = db.Close() }()
			st, err := a.Rotation(ctx, openCommands)
			if err != nil {
				return pkiError(err)
			}
			var (
				certs []pki.NodeCert
				nodes = map[string]fleet.NodeTrust{}
			)
			err = db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
				var err error
				if certs, err = pki.NodeCertsLive(ctx, tx); err != nil {
					return err
				}
				list, err := fleet.NodeTrustList(ctx, tx)
				for _, n := range list {
					nodes[n.ID] = n
				}
				return err
			})
			if err != nil {
				return connect.NewError(connect.CodeUnavailable, err)
			}
			out := cmd.OutOrStdout()
			printRotation(out, st)
			if st.InProgress() {
				fmt.Fprintf(out, "next: %s\n", waitingFor(st))
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tNAME\tROLE\tGENERATION\tEXPIRES\tTRUST VERSION\tLIVENESS\tSTANDS")
			for _, c := range certs {
				n, ok := nodes[c.NodeID]
				name, trust, live := "-", "-", "-"
				if ok {
					name, trust, live = n.Name, fmt.Sprint(n.TrustVersion), n.Liveness
				}
				stands := "current"
				if c.Generation < st.Newest {
					stands = "renews onto generation " + fmt.Sprint(st.Newest)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", c.NodeID, name, c.Role, c.Generation,
					stamp(c.NotAfter), trust, live, stands)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, o := range st.OldSigners {
				fmt.Fprintf(out, "worker key %s of replica %s (command root v%d) is live until %s\n", o.Serial, o.Replica, o.Version, stamp(o.NotAfter))
			}
			return nil
		},
	}
	f.register(cmd)
	return cmd
}
