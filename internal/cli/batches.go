package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/quorum/approval"
)

// envSSHAuthSock is where --ssh-agent finds the agent, as ssh does.
const envSSHAuthSock = "SSH_AUTH_SOCK"

// batchSpec is a batch file: what batches create --file reads.
type batchSpec struct {
	Description string `json:"description"`
	Leaves      []struct {
		Kind    string         `json:"kind"`
		Subject string         `json:"subject"`
		Params  map[string]any `json:"params"`
	} `json:"leaves"`
}

func (a *app) batchesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "batches", Aliases: []string{"batch"},
		Short: "Propose, approve and run quorum batches of destructive commands (docs/quorum.md)"}
	var tenant string

	var (
		leafFlags         []string
		file, description string
		ttl               time.Duration
	)
	create := &cobra.Command{
		Use:   "create (--leaf KIND,SUBJECT[,PARAMS] ... | --file FILE)",
		Short: "Propose a batch of destructive commands",
		Long: `Propose a batch: each --leaf is a destructive kind, its subject (a node id,
or site/<site id>/machine/<machine id> for power.off and power.cycle) and
optionally its params as a JSON object (everything after the second
comma). --file reads {"description", "leaves": [{"kind", "subject",
"params"}]} instead ("-" for standard input). The batch runs only once a
quorum of the tenant's approvers signed it (batches approve).`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &apiv1.CreateCommandBatchRequest{Description: description, TtlSeconds: int64(ttl / time.Second)}
			switch {
			case file != "" && len(leafFlags) > 0:
				return invalidArg("leaf", "pass --leaf or --file, not both")
			case file != "":
				var (
					b   []byte
					err error
				)
				if file == "-" {
					b, err = io.ReadAll(cmd.InOrStdin())
				} else {
					b, err = os.ReadFile(file)
				}
				if err != nil {
					return invalidArg("file", err.Error())
				}
				var spec batchSpec
				if err := json.Unmarshal(b, &spec); err != nil {
					return invalidArg("file", "not a batch file: "+err.Error())
				}
				req.Description = cmpOr(description, spec.Description)
				for i, l := range spec.Leaves {
					st, err := structpb.NewStruct(l.Params)
					if err != nil {
						return invalidArg(fmt.Sprintf("file: leaves[%d].params", i), err.Error())
					}
					req.Leaves = append(req.Leaves, &apiv1.CommandBatchLeafSpec{Kind: l.Kind, Subject: l.Subject, Params: st})
				}
			default:
				for _, f := range leafFlags {
					parts := strings.SplitN(f, ",", 3)
					if len(parts) < 2 {
						return invalidArg("leaf", fmt.Sprintf("%q is not KIND,SUBJECT[,PARAMS]", f))
					}
					leaf := &apiv1.CommandBatchLeafSpec{Kind: parts[0], Subject: parts[1]}
					if len(parts) == 3 {
						var m map[string]any
						if err := json.Unmarshal([]byte(parts[2]), &m); err != nil {
							return invalidArg("leaf", fmt.Sprintf("params of %q are not a JSON object: %v", f, err))
						}
						st, err := structpb.NewStruct(m)
						if err != nil {
							return invalidArg("leaf", err.Error())
						}
						leaf.Params = st
					}
					req.Leaves = append(req.Leaves, leaf)
				}
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req.Tenant = t
			m := newCreate("")
			var resp *connect.Response[apiv1.CreateCommandBatchResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.CommandBatches.Create(cmd.Context(), request(req, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printBatch(cmd, resp.Msg, resp.Msg.GetBatch())
		},
	}
	addTenantFlag(create, &tenant)
	create.Flags().StringArrayVar(&leafFlags, "leaf", nil, "a command: KIND,SUBJECT[,PARAMS JSON] (repeatable)")
	create.Flags().StringVar(&file, "file", "", "a batch file (JSON; - for standard input)")
	create.Flags().StringVar(&description, "description", "", "what the batch is for")
	create.Flags().DurationVar(&ttl, "ttl", 0, "how long the batch waits for its approvals (default 24h, at most 168h)")

	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show a batch with its leaves and approvals",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.CommandBatches.Get(cmd.Context(), connect.NewRequest(&apiv1.GetCommandBatchRequest{Tenant: t, Id: argv[0]}))
			if err != nil {
				return err
			}
			return a.printBatch(cmd, resp.Msg, resp.Msg.GetBatch())
		},
	}
	addTenantFlag(get, &tenant)

	var (
		state string
		limit int
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List batches",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.CommandBatch, string, error) {
				resp, err := c.CommandBatches.List(ctx, connect.NewRequest(&apiv1.ListCommandBatchesRequest{Tenant: t, State: state, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetBatches(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(&apiv1.ListCommandBatchesResponse{Batches: all}, func(w io.Writer) {
				row(w, "ID", "STATE", "APPROVALS", "EPOCH", "ROOT", "CREATED", "EXPIRES", "DESCRIPTION")
				for _, b := range all {
					row(w, b.GetId(), b.GetState(), fmt.Sprintf("-/%d", b.GetThreshold()), strconv.FormatInt(b.GetApproverEpoch(), 10),
						b.GetRoot()[:min(16, len(b.GetRoot()))], ts(b.GetCreateTime()), ts(b.GetExpireTime()), dash(b.GetDescription()))
				}
			})
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)
	list.Flags().StringVar(&state, "state", "", "only batches in this state (pending, approved, ran, canceled, expired)")

	var signer signerFlags
	approve := &cobra.Command{
		Use:   "approve ID (--key FILE | --ssh-agent)",
		Short: "Sign a batch as one of the tenant's approvers",
		Long: `Fetch the batch, recompute its Merkle root from the leaves it lists (each
leaf's params hashed here), and sign that root, the batch id, the trust
domain and the approver epoch with an approver key: --key reads an
Ed25519 or ECDSA private key file (OpenSSH or PKCS#8, no passphrase);
--ssh-agent signs with the agent at $SSH_AUTH_SOCK, using the agent key
that is in the tenant's approver set (--agent-key picks one by SHA256:
fingerprint). A server that shows leaves which do not hash to its root
gets no signature.`,
		Args: positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			got, err := c.CommandBatches.Get(cmd.Context(), connect.NewRequest(&apiv1.GetCommandBatchRequest{Tenant: t, Id: argv[0]}))
			if err != nil {
				return err
			}
			b := got.Msg.GetBatch()
			root, err := BatchRoot(b)
			if err != nil {
				return err
			}
			s, closeSigner, err := a.approverSigner(cmd, c, t, signer)
			if err != nil {
				return err
			}
			defer closeSigner()
			sig, err := approval.Sign(s, approval.BatchMessage(b.GetTrustDomain(), b.GetId(), root, b.GetApproverEpoch()))
			if err != nil {
				return fmt.Errorf("sign batch %s: %w", b.GetId(), err)
			}
			resp, err := c.CommandBatches.Approve(cmd.Context(), connect.NewRequest(&apiv1.ApproveCommandBatchRequest{Tenant: t, Id: b.GetId(),
				Root: approval.HexRoot(root), Approval: &apiv1.KeySignature{Key: approval.AuthorizedKey(s.PublicKey()), Signature: sig}}))
			if err != nil {
				return err
			}
			return a.printBatch(cmd, resp.Msg, resp.Msg.GetBatch())
		},
	}
	addTenantFlag(approve, &tenant)
	signer.add(approve)

	cancel := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a batch that has not run",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.CommandBatches.Cancel(cmd.Context(), connect.NewRequest(&apiv1.CancelCommandBatchRequest{Tenant: t, Id: argv[0]}))
			if err != nil {
				return err
			}
			return a.printBatch(cmd, resp.Msg, resp.Msg.GetBatch())
		},
	}
	addTenantFlag(cancel, &tenant)

	cmd.AddCommand(create, get, list, approve, cancel, a.approversCommand())
	return cmd
}

// BatchRoot recomputes a batch's root from the leaves it lists, and
// refuses a batch whose root or leaf digests disagree with them.
func BatchRoot(b *apiv1.CommandBatch) ([32]byte, error) {
	var leaves []approval.Leaf
	for i, l := range b.GetLeaves() {
		d, _, err := approval.ParamsDigest(l.GetParams().AsMap())
		if err != nil {
			return [32]byte{}, fmt.Errorf("batch %s leaf %d: %w", b.GetId(), i, err)
		}
		if approval.HexRoot(d) != l.GetParamsSha256() {
			return [32]byte{}, fmt.Errorf("batch %s leaf %d: its params hash to %s, the server says %s: not signing", b.GetId(), i, approval.HexRoot(d), l.GetParamsSha256())
		}
		leaves = append(leaves, approval.Leaf{Kind: l.GetKind(), Subject: l.GetSubject(), ParamsDigest: d})
	}
	root, err := approval.Root(leaves)
	if err != nil {
		return root, fmt.Errorf("batch %s: %w", b.GetId(), err)
	}
	if approval.HexRoot(root) != b.GetRoot() {
		return root, fmt.Errorf("batch %s: its leaves hash to root %s, the server says %s: not signing", b.GetId(), approval.HexRoot(root), b.GetRoot())
	}
	return root, nil
}

// signerFlags choose an approver key: a private key file or an agent key.
type signerFlags struct {
	keyFile  string
	sshAgent bool
	agentKey string
}

func (f *signerFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.keyFile, "key", "", "approver private key file (Ed25519 or ECDSA; OpenSSH or PKCS#8)")
	cmd.Flags().BoolVar(&f.sshAgent, "ssh-agent", false, "sign with a key of the SSH agent at $SSH_AUTH_SOCK")
	cmd.Flags().StringVar(&f.agentKey, "agent-key", "", "with --ssh-agent: the SHA256: fingerprint of the agent key to use")
}

// approverSigner opens the signer the flags name. An agent key is chosen
// among those in the tenant's current approver set.
func (a *app) approverSigner(cmd *cobra.Command, c *client.Client, tenant string, f signerFlags) (ssh.Signer, func(), error) {
	nop := func() {}
	switch {
	case f.keyFile != "" && f.sshAgent:
		return nil, nop, invalidArg("key", "pass --key or --ssh-agent, not both")
	case f.keyFile != "":
		b, err := os.ReadFile(f.keyFile)
		if err != nil {
			return nil, nop, invalidArg("key", err.Error())
		}
		s, err := ssh.ParsePrivateKey(b)
		var pp *ssh.PassphraseMissingError
		if errors.As(err, &pp) {
			return nil, nop, invalidArg("key", "the key file is passphrase-protected: load it into an agent and use --ssh-agent")
		}
		if err != nil {
			return nil, nop, invalidArg("key", "not a private key file: "+err.Error())
		}
		return s, nop, nil
	case !f.sshAgent:
		return nil, nop, invalidArg("key", "required: pass --key FILE or --ssh-agent")
	}
	sock, _ := a.lookupEnv(envSSHAuthSock)
	if sock == "" {
		return nil, nop, invalidArg("ssh-agent", "$SSH_AUTH_SOCK is not set")
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return nil, nop, fmt.Errorf("connect to the SSH agent: %w", err)
	}
	closeConn := func() { _ = conn.Close() }
	signers, err := agent.NewClient(conn).Signers()
	if err != nil {
		closeConn()
		return nil, nop, fmt.Errorf("list the SSH agent's keys: %w", err)
	}
	set, err := c.CommandBatches.GetApproverSet(cmd.Context(), connect.NewRequest(&apiv1.GetApproverSetRequest{Tenant: tenant}))
	if err != nil {
		closeConn()
		return nil, nop, err
	}
	var ids []string
	for _, k := range set.Msg.GetApproverSet().GetKeys() {
		ids = append(ids, k.GetKeyId())
	}
	var match []ssh.Signer
	for _, s := range signers {
		id := approval.KeyID(s.PublicKey())
		if slices.Contains(ids, id) && (f.agentKey == "" || f.agentKey == id) {
			match = append(match, s)
		}
	}
	switch len(match) {
	case 1:
		return match[0], closeConn, nil
	case 0:
		closeConn()
		return nil, nop, invalidArg("ssh-agent", fmt.Sprintf("none of the agent's %d keys is an approver of this tenant (epoch %d)", len(signers), set.Msg.GetApproverSet().GetEpoch()))
	default:
		closeConn()
		return nil, nop, invalidArg("agent-key", fmt.Sprintf("%d agent keys are approvers: pick one with --agent-key SHA256:…", len(match)))
	}
}

func (a *app) approversCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "approvers", Short: "Show and change the tenant's approver set (M of N keys)"}
	var tenant string

	get := &cobra.Command{
		Use:   "get",
		Short: "Show the tenant's approver set",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.CommandBatches.GetApproverSet(cmd.Context(), connect.NewRequest(&apiv1.GetApproverSetRequest{Tenant: t}))
			if err != nil {
				return err
			}
			return a.printApprovers(cmd, resp.Msg, resp.Msg.GetApproverSet())
		},
	}
	addTenantFlag(get, &tenant)

	var (
		threshold  int
		publicKeys []string
		approvals  []string
		signer     signerFlags
	)
	readKeys := func() ([]string, []ssh.PublicKey, error) {
		var lines []string
		var keys []ssh.PublicKey
		for _, p := range publicKeys {
			b, err := os.ReadFile(p)
			if err != nil {
				return nil, nil, invalidArg("public-key", err.Error())
			}
			k, err := approval.ParseKey(string(b))
			if err != nil {
				return nil, nil, invalidArg("public-key", p+": "+err.Error())
			}
			lines = append(lines, approval.AuthorizedKey(k))
			keys = append(keys, k)
		}
		return lines, keys, nil
	}
	set := &cobra.Command{
		Use:   "set --threshold M --public-key FILE ... [--approval 'KEY_ID SIGNATURE' ...]",
		Short: "Set the tenant's approvers (a change needs the current set's quorum)",
		Long: `Set the tenant's approver set to the --public-key files (authorized_keys
lines or PEM public keys) with threshold M. The first set needs a tenant
admin only; every later one needs --approval lines from at least the
current threshold of current approvers, each made with
"batches approvers sign" over exactly the same new set.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			lines, _, err := readKeys()
			if err != nil {
				return err
			}
			req := &apiv1.PutApproverSetRequest{Threshold: int32(threshold), PublicKeys: lines}
			for _, a := range approvals {
				id, sig, ok := strings.Cut(strings.TrimSpace(a), " ")
				raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(sig))
				if !ok || err != nil {
					return invalidArg("approval", "must be 'KEY_ID BASE64_SIGNATURE' as approvers sign prints")
				}
				req.Approvals = append(req.Approvals, &apiv1.KeySignature{Key: id, Signature: raw})
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req.Tenant = t
			cur, err := c.CommandBatches.GetApproverSet(cmd.Context(), connect.NewRequest(&apiv1.GetApproverSetRequest{Tenant: t}))
			switch {
			case err == nil:
				req.PreviousEpoch = cur.Msg.GetApproverSet().GetEpoch()
			case client.Code(err) != "NOT_FOUND" || !strings.Contains(err.Error(), "approver set"):
				return err
			}
			resp, err := c.CommandBatches.PutApproverSet(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			return a.printApprovers(cmd, resp.Msg, resp.Msg.GetApproverSet())
		},
	}
	addTenantFlag(set, &tenant)

	sign := &cobra.Command{
		Use:   "sign --threshold M --public-key FILE ... (--key FILE | --ssh-agent)",
		Short: "Approve a new approver set as a current approver; prints an --approval line",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, keys, err := readKeys()
			if err != nil {
				return err
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			cur, err := c.CommandBatches.GetApproverSet(cmd.Context(), connect.NewRequest(&apiv1.GetApproverSetRequest{Tenant: t}))
			if err != nil {
				return err
			}
			cs := cur.Msg.GetApproverSet()
			s, closeSigner, err := a.approverSigner(cmd, c, t, signer)
			if err != nil {
				return err
			}
			defer closeSigner()
			sig, err := approval.Sign(s, approval.SetMessage(cs.GetTrustDomain(), cs.GetTenantId(), cs.GetEpoch()+1, threshold, keys))
			if err != nil {
				return fmt.Errorf("sign the approver set: %w", err)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", approval.KeyID(s.PublicKey()), base64.StdEncoding.EncodeToString(sig))
			return err
		},
	}
	addTenantFlag(sign, &tenant)
	for _, c := range []*cobra.Command{set, sign} {
		c.Flags().IntVar(&threshold, "threshold", 0, "how many approvers must sign a batch (M)")
		c.Flags().StringArrayVar(&publicKeys, "public-key", nil, "an approver's public key file (repeatable)")
	}
	set.Flags().StringArrayVar(&approvals, "approval", nil, "a current approver's approval of this change, as 'approvers sign' prints it (repeatable)")
	signer.add(sign)

	cmd.AddCommand(get, set, sign)
	return cmd
}

func (a *app) printBatch(cmd *cobra.Command, msg proto.Message, b *apiv1.CommandBatch) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "STATE", "APPROVALS", "EPOCH", "ROOT", "EXPIRES")
		row(w, b.GetId(), b.GetState(), fmt.Sprintf("%d/%d", len(b.GetApprovals()), b.GetThreshold()),
			strconv.FormatInt(b.GetApproverEpoch(), 10), b.GetRoot(), ts(b.GetExpireTime()))
		if len(b.GetLeaves()) > 0 {
			row(w)
			row(w, "LEAF", "KIND", "SUBJECT", "PARAMS SHA256", "COMMAND")
			for _, l := range b.GetLeaves() {
				row(w, strconv.Itoa(int(l.GetIndex())), l.GetKind(), l.GetSubject(), l.GetParamsSha256(), dash(l.GetCommandId()))
			}
		}
		for _, ap := range b.GetApprovals() {
			row(w, "approved by "+ap.GetKeyId(), ap.GetApprovedBy(), ts(ap.GetCreateTime()))
		}
	})
}

func (a *app) printApprovers(cmd *cobra.Command, msg proto.Message, s *apiv1.ApproverSet) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "EPOCH", "THRESHOLD", "KEYS", "DIGEST")
		row(w, strconv.FormatInt(s.GetEpoch(), 10), fmt.Sprintf("%d of %d", s.GetThreshold(), len(s.GetKeys())),
			strconv.Itoa(len(s.GetKeys())), s.GetDigest())
		for _, k := range s.GetKeys() {
			row(w, "key", k.GetKeyId(), k.GetPublicKey())
		}
	})
}
