package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/audit"
)

const auditKeyHelp = "the log's public key (a note verifier key, as `audit key` prints it) to check signatures against; without it the server's own key is used, which proves consistency but not who signed"

// auditTreeCommands are the verifiable audit log's commands: the signed
// checkpoint, the key, inclusion and consistency proofs, and the checks.
// Every proof is verified here, against the key, before it is shown.
func (a *app) auditTreeCommands() []*cobra.Command {
	key := &cobra.Command{
		Use:   "key",
		Short: "Print the public key the audit log's checkpoints are signed with (what a third party verifies against)",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			resp, err := c.Audit.GetLogKey(cmd.Context(), connect.NewRequest(&apiv1.GetAuditLogKeyRequest{}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				fmt.Fprintln(w, resp.Msg.GetVerifierKey())
			})
		},
	}

	var (
		size       uint64
		out, pin   string
		from, prf  string
		full       bool
		entrySize  uint64
		outProof   string
		outConsist string
	)
	checkpoint := &cobra.Command{
		Use:   "checkpoint [--size N] [--out FILE]",
		Short: "Show the latest signed checkpoint of the audit log (or the one of --size), verified against the log's key",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			vkey, fromServer, err := a.auditKey(cmd.Context(), pin)
			if err != nil {
				return err
			}
			resp, err := c.Audit.GetCheckpoint(cmd.Context(), connect.NewRequest(&apiv1.GetAuditCheckpointRequest{Size: size}))
			if err != nil {
				return err
			}
			cp, err := audit.OpenCheckpoint([]byte(resp.Msg.GetCheckpoint().GetNote()), vkey)
			if err != nil {
				return err
			}
			if err := writeOut(out, []byte(resp.Msg.GetCheckpoint().GetNote())); err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				printCheckpoint(w, cp, vkey, fromServer)
				if out != "" {
					row(w, "SAVED", out)
				}
			})
		},
	}
	checkpoint.Flags().Uint64Var(&size, "size", 0, "the checkpoint of this tree size (default: the latest)")
	checkpoint.Flags().StringVar(&out, "out", "", "save the signed checkpoint to this file (for a later `audit verify --from`)")
	checkpoint.Flags().StringVar(&pin, "key", "", auditKeyHelp)

	prove := &cobra.Command{
		Use:   "prove ENTRY [--out FILE]",
		Short: "Fetch an audit entry's inclusion proof and verify it against the signed checkpoint and the log's key",
		Args:  positional("ENTRY"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			vkey, fromServer, err := a.auditKey(cmd.Context(), pin)
			if err != nil {
				return err
			}
			resp, err := c.Audit.ProveInclusion(cmd.Context(), connect.NewRequest(&apiv1.ProveAuditInclusionRequest{EntryId: argv[0], CheckpointSize: entrySize}))
			if err != nil {
				return err
			}
			b := audit.Bundle{Kind: audit.BundleInclusion, Checkpoint: resp.Msg.GetCheckpoint().GetNote(), LeafIndex: resp.Msg.GetLeafIndex(),
				Leaf: resp.Msg.GetLeaf(), Proof: resp.Msg.GetProof()}
			v, err := audit.VerifyBundle(b, vkey)
			if err != nil {
				return err
			}
			if v.Entry.ID != argv[0] {
				return fmt.Errorf("%w: the server proved entry %s, not %s", audit.ErrProof, v.Entry.ID, argv[0])
			}
			if err := writeBundle(outProof, b); err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				printVerified(w, v, vkey, fromServer)
				if outProof != "" {
					row(w, "SAVED", outProof)
				}
			})
		},
	}
	prove.Flags().Uint64Var(&entrySize, "size", 0, "prove against the checkpoint of this tree size (default: the latest)")
	prove.Flags().StringVar(&outProof, "out", "", "save the proof bundle to this file, for `audit verify --proof FILE --key KEY` offline")
	prove.Flags().StringVar(&pin, "key", "", auditKeyHelp)

	verify := &cobra.Command{
		Use:   "verify (--from CHECKPOINT_FILE | --proof FILE --key KEY | --full)",
		Short: "Verify the audit log: consistency from a saved checkpoint to the latest, a saved proof offline, or every entry",
		Long: `Verify the audit log one of three ways.

  --from FILE   a checkpoint saved earlier (audit checkpoint --out): fetch a
                consistency proof from it to the latest checkpoint and verify
                that the log only grew since; --out saves the proof bundle.
  --proof FILE  a bundle saved by audit prove --out or audit verify --out,
                verified offline with nothing but --key: no server is called.
  --full        the server recomputes every leaf from its row and the root at
                every signed checkpoint (platform administrators); an edited,
                deleted or reordered row is reported and the command fails.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			modes := 0
			for _, set := range []bool{from != "", prf != "", full} {
				if set {
					modes++
				}
			}
			if modes != 1 {
				return invalidArg("from", "give exactly one of --from, --proof and --full")
			}
			switch {
			case prf != "":
				return a.auditVerifyOffline(cmd, prf, pin)
			case full:
				return a.auditVerifyFull(cmd)
			default:
				return a.auditVerifyFrom(cmd, from, pin, outConsist)
			}
		},
	}
	verify.Flags().StringVar(&from, "from", "", "a signed checkpoint saved by `audit checkpoint --out`")
	verify.Flags().StringVar(&prf, "proof", "", "a proof bundle saved by `audit prove --out` or `audit verify --out`, verified offline (needs --key)")
	verify.Flags().BoolVar(&full, "full", false, "recompute every leaf and every checkpoint's root on the server (platform administrators)")
	verify.Flags().StringVar(&outConsist, "out", "", "with --from: save the consistency proof bundle to this file")
	verify.Flags().StringVar(&pin, "key", "", auditKeyHelp+"; required with --proof")
	return []*cobra.Command{key, checkpoint, prove, verify}
}

// auditKey returns the key to verify with: the pinned one, else the
// server's (fromServer).
func (a *app) auditKey(ctx context.Context, pin string) (key string, fromServer bool, err error) {
	if pin = strings.TrimSpace(pin); pin != "" {
		return pin, false, nil
	}
	c, err := a.client()
	if err != nil {
		return "", false, err
	}
	resp, err := c.Audit.GetLogKey(ctx, connect.NewRequest(&apiv1.GetAuditLogKeyRequest{}))
	if err != nil {
		return "", false, err
	}
	return resp.Msg.GetVerifierKey(), true, nil
}

func (a *app) auditVerifyFrom(cmd *cobra.Command, path, pin, out string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return invalidArg("from", err.Error())
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	vkey, fromServer, err := a.auditKey(cmd.Context(), pin)
	if err != nil {
		return err
	}
	fromCP, err := audit.OpenCheckpoint(old, vkey)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	resp, err := c.Audit.ProveConsistency(cmd.Context(), connect.NewRequest(&apiv1.ProveAuditConsistencyRequest{FromSize: fromCP.Size}))
	if err != nil {
		return err
	}
	b := audit.Bundle{Kind: audit.BundleConsistency, FromCheckpoint: string(old), Checkpoint: resp.Msg.GetCheckpoint().GetNote(), Proof: resp.Msg.GetProof()}
	v, err := audit.VerifyBundle(b, vkey)
	if err != nil {
		return err
	}
	if err := writeBundle(out, b); err != nil {
		return err
	}
	return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
		printVerified(w, v, vkey, fromServer)
		if out != "" {
			row(w, "SAVED", out)
		}
	})
}

// auditVerifyOffline checks a saved bundle with only the key: it calls no
// server.
func (a *app) auditVerifyOffline(cmd *cobra.Command, path, pin string) error {
	if strings.TrimSpace(pin) == "" {
		return invalidArg("key", "is required with --proof: the log's public key, as `audit key` prints it")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return invalidArg("proof", err.Error())
	}
	b, err := audit.ParseBundle(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	v, err := audit.VerifyBundle(b, pin)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if v.Kind == audit.BundleInclusion {
		m := &apiv1.ProveAuditInclusionResponse{Entry: audit.EntryProto(v.Entry), Leaf: b.Leaf, LeafIndex: b.LeafIndex, Proof: b.Proof,
			Checkpoint: audit.CheckpointProto(v.Checkpoint)}
		return a.printer(cmd.OutOrStdout()).print(m, func(w io.Writer) { printVerified(w, v, pin, false) })
	}
	m := &apiv1.ProveAuditConsistencyResponse{Proof: b.Proof, Checkpoint: audit.CheckpointProto(v.Checkpoint)}
	return a.printer(cmd.OutOrStdout()).print(m, func(w io.Writer) { printVerified(w, v, pin, false) })
}

func (a *app) auditVerifyFull(cmd *cobra.Command) error {
	c, err := a.client()
	if err != nil {
		return err
	}
	resp, err := c.Audit.CheckLog(cmd.Context(), connect.NewRequest(&apiv1.CheckAuditLogRequest{}))
	if err != nil {
		return err
	}
	m := resp.Msg
	if err := a.printer(cmd.OutOrStdout()).print(m, func(w io.Writer) {
		row(w, "ENTRIES", strconv.FormatUint(m.GetEntries(), 10))
		row(w, "CHECKPOINTS", strconv.FormatUint(m.GetCheckpoints(), 10))
		if l := m.GetLatest(); l != nil {
			row(w, "LATEST", fmt.Sprintf("size %d, root %s", l.GetSize(), base64.StdEncoding.EncodeToString(l.GetRootHash())))
		}
		for _, p := range m.GetProblems() {
			row(w, "PROBLEM", p.GetReason())
		}
		if len(m.GetProblems()) == 0 {
			row(w, "RESULT", "every entry and every checkpoint's root recomputed from the rows: clean")
		}
	}); err != nil {
		return err
	}
	if n := len(m.GetProblems()); n > 0 {
		return fmt.Errorf("the audit log does not verify: %d problem(s)", n)
	}
	return nil
}

func printCheckpoint(w io.Writer, cp audit.Checkpoint, vkey string, fromServer bool) {
	row(w, "ORIGIN", cp.Origin)
	row(w, "SIZE", strconv.FormatUint(cp.Size, 10))
	row(w, "ROOT", base64.StdEncoding.EncodeToString(cp.Root))
	row(w, "SIGNATURE", "verified with "+keyNote(vkey, fromServer))
}

func printVerified(w io.Writer, v audit.Verified, vkey string, fromServer bool) {
	switch v.Kind {
	case audit.BundleInclusion:
		e := v.Entry
		row(w, "ENTRY", e.ID)
		row(w, "TIME", stamp(e.Time))
		row(w, "ACTION", e.Action)
		row(w, "RESOURCE", e.ResourceType+"/"+e.ResourceID)
		row(w, "PRINCIPAL", dash(e.PrincipalID))
		row(w, "TENANT", dash(e.TenantID))
		row(w, "DECISION", e.Decision)
		row(w, "RESULT", dash(e.Result))
		row(w, "LEAF", fmt.Sprintf("%d of %d", v.LeafIndex, v.Checkpoint.Size))
		row(w, "VERIFIED", fmt.Sprintf("included in the checkpoint of size %d, root %s", v.Checkpoint.Size, base64.StdEncoding.EncodeToString(v.Checkpoint.Root)))
	case audit.BundleConsistency:
		row(w, "FROM", fmt.Sprintf("size %d, root %s", v.From.Size, base64.StdEncoding.EncodeToString(v.From.Root)))
		row(w, "TO", fmt.Sprintf("size %d, root %s", v.Checkpoint.Size, base64.StdEncoding.EncodeToString(v.Checkpoint.Root)))
		row(w, "VERIFIED", fmt.Sprintf("the log of size %d extends the one of size %d: no entry changed, removed or reordered", v.Checkpoint.Size, v.From.Size))
	}
	row(w, "SIGNATURE", "verified with "+keyNote(vkey, fromServer))
}

func keyNote(vkey string, fromServer bool) string {
	if fromServer {
		return vkey + " (the server's own key: pin it with --key to prove who signed)"
	}
	return vkey
}

func writeOut(path string, b []byte) error {
	if path == "" {
		return nil
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return invalidArg("out", err.Error())
	}
	return nil
}

func writeBundle(path string, b audit.Bundle) error {
	if path == "" {
		return nil
	}
	raw, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return writeOut(path, append(raw, '\n'))
}
