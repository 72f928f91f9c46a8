package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// fleetCommands are the verbs of the fleet: nodes, their commands, join
// tokens and requests, and inventory.
func (a *app) fleetCommands() []*cobra.Command {
	return []*cobra.Command{a.nodesCommand(), a.commandsCommand(), a.batchesCommand(), a.joinTokensCommand(), a.joinRequestsCommand(), a.inventoryCommand(), a.trustAnchorsCommand(), a.gpusCommand(), a.remediationsCommand()}
}

// fleetTenant resolves the optional --tenant of a fleet verb: the flag, the
// context's or the token's tenant, or none for a platform token (whose
// calls then span every tenant).
func (a *app) fleetTenant(cmd *cobra.Command, flag string) (string, error) {
	return a.tenant(cmd.Context(), flag, false)
}

func (a *app) nodesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "nodes", Aliases: []string{"node"}, Short: "List, drain and delete the fleet's nodes"}
	var tenant string

	var project, state, liveness string
	var limit int
	var showLabels bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List nodes",
		Long: `List nodes: each node's GPUs, by the model name pool selectors and --model use, and the
pool it is in ("-" for none: no pool selects it, or two do). --show-labels adds every label
a pool selector can match, the node's own and those derived from its inventory (gpu.model,
gpu.count, gpu.memory).`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := a.fleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Node, string, error) {
				resp, err := c.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{
					Tenant: t, Project: project, State: state, Liveness: liveness, PageToken: token, PageSize: size,
				}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetNodes(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(&apiv1.ListNodesResponse{Nodes: all}, func(w io.Writer) {
				nodeTableLabels(w, showLabels, all...)
			})
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)
	list.Flags().BoolVar(&showLabels, "show-labels", false, "add the labels pool selectors match (own and derived from inventory)")
	list.Flags().StringVar(&project, "project", "", "only nodes of this project")
	list.Flags().StringVar(&state, "state", "", "only nodes in this state: joining, active, draining, drained, retired")
	list.Flags().StringVar(&liveness, "liveness", "", "only nodes with this liveness: ready, unreachable, lost")

	get := &cobra.Command{
		Use:   "get NODE",
		Short: "Show a node (name or id)",
		Args:  positional("NODE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Nodes.Get(cmd.Context(), connect.NewRequest(&apiv1.GetNodeRequest{Tenant: t, Node: argv[0]}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				n := resp.Msg.GetNode()
				nodeTable(w, n)
				// The labels, so a pool selector can be written without
				// guessing; derived ones a label of the node overrides are
				// left out.
				fmt.Fprintf(w, "\nlabels: %s\n", dash(labelString(n.GetLabels())))
				derived := map[string]string{}
				for k, v := range n.GetDerivedLabels() {
					if _, own := n.GetLabels()[k]; !own {
						derived[k] = v
					}
				}
				fmt.Fprintf(w, "derived labels: %s\n", dash(labelString(derived)))
				// What admitted the node, as its certificate records it.
				fmt.Fprintf(w, "attestor: %s", dash(n.GetAttestor()))
				if n.GetAttestedId() != "" {
					fmt.Fprintf(w, " (%s, trust anchor %s)", n.GetAttestedId(), dash(n.GetTrustAnchorId()))
				}
				fmt.Fprintln(w)
				conditionTable(w, n.GetConditions())
			})
		},
	}
	addTenantFlag(get, &tenant)

	var reason string
	drain := &cobra.Command{
		Use:   "drain NODE",
		Short: "Stop new work landing on a node and ask its agent to wind down",
		Args:  positional("NODE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			// No retry: a repeated drain would answer FAILED_PRECONDITION
			// for a drain that in fact succeeded.
			resp, err := c.Nodes.Drain(cmd.Context(), connect.NewRequest(&apiv1.DrainNodeRequest{Tenant: t, Node: argv[0], Reason: reason}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				nodeTable(w, resp.Msg.GetNode())
				fmt.Fprintf(w, "\ncommand: %s (%s)\n", resp.Msg.GetCommand().GetId(), resp.Msg.GetCommand().GetKind())
			})
		},
	}
	addTenantFlag(drain, &tenant)
	drain.Flags().StringVar(&reason, "reason", "", "why, for the audit trail and the agent")

	undrain := &cobra.Command{
		Use:   "undrain NODE",
		Short: "Return a draining or drained node to service",
		Args:  positional("NODE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Nodes.Undrain(cmd.Context(), connect.NewRequest(&apiv1.UndrainNodeRequest{Tenant: t, Node: argv[0]}))
			if err != nil {
				return err
			}
			return a.printNodes(cmd, resp.Msg, resp.Msg.GetNode())
		},
	}
	addTenantFlag(undrain, &tenant)

	var confirmationID string
	del := &cobra.Command{
		Use:   "delete NODE",
		Short: "Forget a retired (or never joined) node and revoke its certificates",
		Args:  positional("NODE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Nodes.Delete(cmd.Context(), request(&apiv1.DeleteNodeRequest{Tenant: t, Node: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				row(w, fmt.Sprintf("node %s deleted; %d certificates revoked", argv[0], resp.Msg.GetRevokedCertificates()))
			})
		},
	}
	addTenantFlag(del, &tenant)
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(list, get, drain, undrain, del, a.nodesHealthCommand())
	return cmd
}

// clientFleetTenant returns the client and the optional tenant.
func (a *app) clientFleetTenant(cmd *cobra.Command, flag string) (*client.Client, string, error) {
	c, err := a.client()
	if err != nil {
		return nil, "", err
	}
	t, err := a.fleetTenant(cmd, flag)
	if err != nil {
		return nil, "", err
	}
	return c, t, nil
}

func (a *app) printNodes(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Node) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) { nodeTable(w, items...) })
}

func nodeTable(w io.Writer, items ...*apiv1.Node) { nodeTableLabels(w, false, items...) }

// nodeTableLabels prints nodes, with a LABELS column of their effective
// labels (own over derived) when showLabels is set.
func nodeTableLabels(w io.Writer, showLabels bool, items ...*apiv1.Node) {
	now := time.Now()
	head := []string{"NAME", "ID", "STATE", "LIVENESS", "GPUS", "POOL", "AGE", "LAST SEEN"}
	if showLabels {
		head = append(head, "LABELS")
	}
	row(w, head...)
	for _, n := range items {
		cells := []string{n.GetName(), n.GetId(), n.GetState(), n.GetLiveness(), gpus(n), dash(n.GetPool()),
			age(now, n.GetCreateTime()), ago(now, n.GetLastHeartbeat())}
		if showLabels {
			cells = append(cells, dash(labelString(effectiveLabels(n))))
		}
		row(w, cells...)
	}
}

// effectiveLabels are what pool selectors match: the derived labels with
// the node's own over them.
func effectiveLabels(n *apiv1.Node) map[string]string {
	out := map[string]string{}
	for k, v := range n.GetDerivedLabels() {
		out[k] = v
	}
	for k, v := range n.GetLabels() {
		out[k] = v
	}
	return out
}

func conditionTable(w io.Writer, conds []*apiv1.NodeCondition) {
	if len(conds) == 0 {
		return
	}
	fmt.Fprintln(w)
	row(w, "CONDITION", "STATUS", "REASON", "MESSAGE")
	for _, c := range conds {
		row(w, c.GetType(), c.GetStatus(), dash(c.GetReason()), dash(c.GetMessage()))
	}
}

// gpus summarizes a node's GPUs as "8 × H100": the model by the name the
// gpu.model label, pool selectors, --model and the capacity and
// reservation views use, not the marketing name the driver reports.
func gpus(n *apiv1.Node) string {
	if n.GetGpuCount() == 0 {
		return "-"
	}
	model := n.GetGpuModel()
	if m := n.GetDerivedLabels()["gpu.model"]; m != "" && model != "mixed" {
		model = m
	}
	return fmt.Sprintf("%d × %s", n.GetGpuCount(), dash(model))
}

// age is how long ago t was, in the largest whole unit (5d, 3h, 12m, 40s).
func age(now time.Time, t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	d := max(now.Sub(t.AsTime()), 0)
	switch {
	case d >= 48*time.Hour:
		return strconv.Itoa(int(d/(24*time.Hour))) + "d"
	case d >= time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	case d >= time.Minute:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	default:
		return strconv.Itoa(int(d/time.Second)) + "s"
	}
}

func ago(now time.Time, t *timestamppb.Timestamp) string {
	if t == nil {
		return "never"
	}
	return age(now, t) + " ago"
}

// terminalCommand reports whether a command's state is final.
func terminalCommand(state string) bool {
	switch state {
	case "succeeded", "failed", "canceled", "expired":
		return true
	}
	return false
}

func (a *app) commandsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "commands", Aliases: []string{"command", "cmd"}, Short: "Run commands on nodes and follow them"}
	var tenant string

	var (
		node, confirmationID, batch string
		params                      []string
		deadline                    time.Duration
		wait                        bool
	)
	run := &cobra.Command{
		Use:   "run KIND --node NODE | run --batch ID",
		Short: "Run a command on a node (inventory.refresh, node.drain), or an approved batch's commands",
		Long: `Queue a command for a node's agent. --param k=v sets a parameter; a value
that parses as JSON (a number, true, ["a","b"]) is sent as such, anything
else as a string. --wait polls the command until it finishes and fails
unless it succeeded.

--batch ID runs an approved command batch instead (docs/quorum.md): each of
its leaves becomes one command, once, however often it is run. Destructive
kinds (disk.wipe, image.write, power.off, power.cycle) run only that way.`,
		Args: func(cmd *cobra.Command, got []string) error {
			if batch != "" {
				return positional()(cmd, got)
			}
			return positional("KIND")(cmd, got)
		},
		RunE: func(cmd *cobra.Command, argv []string) error {
			if batch != "" {
				if node != "" || len(params) > 0 {
					return invalidArg("batch", "a batch names its own nodes and params: drop --node and --param")
				}
				c, t, err := a.clientFleetTenant(cmd, tenant)
				if err != nil {
					return err
				}
				resp, err := c.CommandBatches.Run(cmd.Context(), connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: t, Id: batch}))
				if err != nil {
					return err
				}
				return a.printBatch(cmd, resp.Msg, resp.Msg.GetBatch())
			}
			if node == "" {
				return invalidArg("node", "required: pass --node")
			}
			st, err := parseParams(params)
			if err != nil {
				return err
			}
			if deadline < 0 {
				return invalidArg("deadline", "must not be negative")
			}
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.RunCommandResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Commands.Run(cmd.Context(), request(&apiv1.RunCommandRequest{
					Tenant: t, Node: node, Kind: argv[0], Params: st, DeadlineSeconds: int32(deadline / time.Second),
				}, m))
				return err
			})
			if err != nil {
				return err
			}
			command := resp.Msg.GetCommand()
			if wait {
				if command, err = a.waitCommand(cmd.Context(), c, t, command); err != nil {
					return err
				}
			}
			if err := a.printCommands(cmd, &apiv1.GetCommandResponse{Command: command}, command); err != nil {
				return err
			}
			if wait && command.GetState() != "succeeded" {
				return connect.NewError(connect.CodeAborted, fmt.Errorf("command %s %s: %s",
					command.GetId(), command.GetState(), cmpOr(command.GetMessage(), command.GetFailureCode())))
			}
			return nil
		},
	}
	addTenantFlag(run, &tenant)
	run.Flags().StringVar(&node, "node", "", "node name or id")
	run.Flags().StringArrayVar(&params, "param", nil, "parameter k=v (repeatable)")
	run.Flags().DurationVar(&deadline, "deadline", 0, "how long the command may take (default 5m, at most 24h)")
	run.Flags().BoolVar(&wait, "wait", false, "wait until the command finishes")
	run.Flags().StringVar(&batch, "batch", "", "run an approved command batch's commands instead")
	addConfirmationFlag(run, &confirmationID)

	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show a command",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Commands.Get(cmd.Context(), connect.NewRequest(&apiv1.GetCommandRequest{Tenant: t, Id: argv[0]}))
			if err != nil {
				return err
			}
			return a.printCommands(cmd, resp.Msg, resp.Msg.GetCommand())
		},
	}
	addTenantFlag(get, &tenant)

	var listNode, state string
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List commands",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Command, string, error) {
				resp, err := c.Commands.List(ctx, connect.NewRequest(&apiv1.ListCommandsRequest{Tenant: t, Node: listNode, State: state, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetCommands(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printCommands(cmd, &apiv1.ListCommandsResponse{Commands: all}, all...)
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)
	list.Flags().StringVar(&listNode, "node", "", "only commands of this node")
	list.Flags().StringVar(&state, "state", "", "only commands in this state (pending, running, succeeded, ...)")

	cancel := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a command that has not finished",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Commands.Cancel(cmd.Context(), connect.NewRequest(&apiv1.CancelCommandRequest{Tenant: t, Id: argv[0]}))
			if err != nil {
				return err
			}
			return a.printCommands(cmd, resp.Msg, resp.Msg.GetCommand())
		},
	}
	addTenantFlag(cancel, &tenant)

	cmd.AddCommand(run, get, list, cancel)
	return cmd
}

// waitCommand polls a command until it reaches a final state.
func (a *app) waitCommand(ctx context.Context, c *client.Client, tenant string, command *apiv1.Command) (*apiv1.Command, error) {
	// Five backoffs: one second by default, a few milliseconds in tests.
	poll := 5 * a.retryBackoff
	for !terminalCommand(command.GetState()) {
		select {
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeCanceled, fmt.Errorf("stopped waiting for command %s (%s)", command.GetId(), command.GetState()))
		case <-time.After(poll):
		}
		resp, err := c.Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Tenant: tenant, Id: command.GetId()}))
		if err != nil {
			return nil, err
		}
		command = resp.Msg.GetCommand()
	}
	return command, nil
}

// parseParams turns k=v flags into a Struct.
func parseParams(kvs []string) (*structpb.Struct, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]any{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, invalidArg("param", fmt.Sprintf("must be k=v, got %q", kv))
		}
		var val any
		if json.Unmarshal([]byte(v), &val) != nil {
			val = v
		}
		m[k] = val
	}
	st, err := structpb.NewStruct(m)
	if err != nil {
		return nil, invalidArg("param", err.Error())
	}
	return st, nil
}

func (a *app) printCommands(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Command) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		nodes := a.nodeNames(cmd.Context(), items)
		row(w, "ID", "NODE", "SEQ", "KIND", "STATE", "PROGRESS", "MESSAGE", "CREATED", "DEADLINE")
		for _, c := range items {
			row(w, c.GetId(), cmpOr(nodes[c.GetNodeId()], c.GetNodeId()), strconv.FormatInt(c.GetSeq(), 10), c.GetKind(), c.GetState(),
				fmt.Sprintf("%d%%", c.GetProgress()), dash(cmpOr(c.GetMessage(), c.GetFailureCode())), ts(c.GetCreateTime()), ts(c.GetDeadline()))
		}
	})
}

func (a *app) joinTokensCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "join-tokens", Aliases: []string{"join-token"}, Short: "Mint, list and revoke the tokens machines join with"}
	var tenant string

	var (
		project, pool, role, site, confirmationID, attestor string
		labels                                              []string
		ttl                                                 time.Duration
	)
	create := &cobra.Command{
		Use:   "create --tenant T --project P",
		Short: "Create a join token and print it once",
		Long: `Create a join token for machines joining a tenant's project (and pool, with
labels). The token is printed once and never again: hand it to bcd now.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if project == "" {
				return invalidArg("project", "required: pass --project")
			}
			if ttl < 0 {
				return invalidArg("ttl", "must not be negative")
			}
			lm, err := parseLabels(labels)
			if err != nil {
				return err
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateJoinTokenResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.JoinTokens.Create(cmd.Context(), request(&apiv1.CreateJoinTokenRequest{
					Tenant: t, Project: project, Pool: pool, Labels: lm, TtlSeconds: int64(ttl / time.Second), Role: role, Site: site,
					Attestor: attestor,
				}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				joinTokenTable(w, resp.Msg.GetJoinToken())
				fmt.Fprintf(w, "\ntoken: %s  (shown once; store it now)\n", resp.Msg.GetToken())
			})
		},
	}
	addTenantFlag(create, &tenant)
	create.Flags().StringVar(&project, "project", "", "project the nodes join (name or id)")
	create.Flags().StringVar(&pool, "pool", "", "pool the nodes join")
	create.Flags().StringArrayVar(&labels, "label", nil, "label k=v the nodes get (repeatable)")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime, e.g. 1h (default 1h, at most 168h)")
	create.Flags().StringVar(&role, "role", "", "role of the joining agent: node (default), site or ramdisk; a bcd in another mode is refused")
	create.Flags().StringVar(&site, "site", "", "site a site token (--role site) binds its agent to (name or id)")
	create.Flags().StringVar(&attestor, "attestor", "", "require attestation besides the token: tpm, x509, cloud or kubelet (the tenant needs a trust anchor of that kind)")
	addConfirmationFlag(create, &confirmationID)

	var limit int
	var inactive bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List join tokens (never the tokens themselves)",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.JoinToken, string, error) {
				resp, err := c.JoinTokens.List(ctx, connect.NewRequest(&apiv1.ListJoinTokensRequest{Tenant: t, IncludeInactive: inactive, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetJoinTokens(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(&apiv1.ListJoinTokensResponse{JoinTokens: all}, func(w io.Writer) { joinTokenTable(w, all...) })
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)
	list.Flags().BoolVar(&inactive, "include-inactive", false, "include used, expired and revoked tokens")

	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a join token",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.JoinTokens.Revoke(cmd.Context(), request(&apiv1.RevokeJoinTokenRequest{Tenant: t, Id: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { joinTokenTable(w, resp.Msg.GetJoinToken()) })
		},
	}
	addTenantFlag(revoke, &tenant)
	addConfirmationFlag(revoke, &confirmationID)

	cmd.AddCommand(create, list, revoke)
	return cmd
}

func joinTokenTable(w io.Writer, items ...*apiv1.JoinToken) {
	row(w, "ID", "STATE", "ROLE", "ATTESTOR", "TENANT", "PROJECT", "POOL", "LABELS", "EXPIRES", "NODE", "SITE")
	for _, t := range items {
		row(w, t.GetId(), t.GetState(), dash(t.GetRole()), dash(t.GetAttestor()), t.GetTenantId(), t.GetProjectId(), dash(t.GetPool()), dash(labelString(t.GetLabels())),
			ts(t.GetExpireTime()), dash(t.GetNodeId()), dash(t.GetSiteId()))
	}
}

// parseLabels turns k=v flags into a map.
func parseLabels(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, invalidArg("label", fmt.Sprintf("must be k=v, got %q", kv))
		}
		m[k] = v
	}
	return m, nil
}

// labelString prints labels sorted, k=v,k=v.
func labelString(m map[string]string) string {
	kvs := make([]string, 0, len(m))
	for k, v := range m {
		kvs = append(kvs, k+"="+v)
	}
	slices.Sort(kvs)
	return strings.Join(kvs, ",")
}

func (a *app) joinRequestsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "join-requests", Aliases: []string{"join-request"}, Short: "Approve or reject deferred joins"}
	var tenant, state string
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List join requests",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.JoinRequest, string, error) {
				resp, err := c.JoinRequests.List(ctx, connect.NewRequest(&apiv1.ListJoinRequestsRequest{Tenant: t, State: state, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetJoinRequests(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printJoinRequests(cmd, &apiv1.ListJoinRequestsResponse{JoinRequests: all}, all...)
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)
	list.Flags().StringVar(&state, "state", "", "only requests in this state: pending, approved, rejected, admitted")

	approve := &cobra.Command{
		Use:   "approve ID",
		Short: "Admit a deferred join (exactly one join)",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.JoinRequests.Approve(cmd.Context(), connect.NewRequest(&apiv1.ApproveJoinRequestRequest{Tenant: t, Id: argv[0]}))
			if err != nil {
				return err
			}
			return a.printJoinRequests(cmd, resp.Msg, resp.Msg.GetJoinRequest())
		},
	}
	addTenantFlag(approve, &tenant)

	reject := &cobra.Command{
		Use:   "reject ID",
		Short: "Refuse a deferred join",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.JoinRequests.Reject(cmd.Context(), connect.NewRequest(&apiv1.RejectJoinRequestRequest{Tenant: t, Id: argv[0]}))
			if err != nil {
				return err
			}
			return a.printJoinRequests(cmd, resp.Msg, resp.Msg.GetJoinRequest())
		},
	}
	addTenantFlag(reject, &tenant)

	cmd.AddCommand(list, approve, reject)
	return cmd
}

func (a *app) printJoinRequests(cmd *cobra.Command, msg proto.Message, items ...*apiv1.JoinRequest) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "STATE", "TENANT", "IDENTITY", "REASON", "TOKEN", "CREATED", "DECIDED BY")
		for _, r := range items {
			row(w, r.GetId(), r.GetState(), r.GetTenantId(), dash(r.GetIdentity()), dash(r.GetReason()), r.GetTokenId(),
				ts(r.GetCreateTime()), dash(r.GetDecidedBy()))
		}
	})
}

func (a *app) inventoryCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "inventory", Short: "Read what nodes report about their hardware"}
	var tenant string
	get := &cobra.Command{
		Use:   "get NODE",
		Short: "Show a node's GPUs, NVLinks, NUMA layout and resources",
		Args:  positional("NODE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Inventory.Get(cmd.Context(), connect.NewRequest(&apiv1.GetInventoryRequest{Tenant: t, Node: argv[0]}))
			if err != nil {
				return err
			}
			inv := resp.Msg
			return a.printer(cmd.OutOrStdout()).print(inv, func(w io.Writer) {
				row(w, "INDEX", "UUID", "MODEL", "MEMORY", "PCI", "NUMA", "MIG")
				for _, g := range inv.GetGpus() {
					mig := g.GetMigMode()
					if n := len(g.GetMigInstances()); n > 0 {
						mig += fmt.Sprintf(" (%d instances)", n)
					}
					row(w, strconv.Itoa(int(g.GetIndex())), g.GetUuid(), g.GetModel(), fmt.Sprintf("%d MiB", g.GetMemoryMib()),
						dash(g.GetPciBusId()), strconv.Itoa(int(g.GetNumaNode())), dash(mig))
				}
				if r := inv.GetResources(); r != nil {
					fmt.Fprintf(w, "\ncpu: %s, %d sockets, %d cores, %d threads; memory %d MiB\n",
						r.GetCpuModel(), r.GetSockets(), r.GetCores(), r.GetThreads(), r.GetMemoryMib())
				}
				fmt.Fprintf(w, "nvlinks: %d  numa nodes: %d  digest: %s\n", len(inv.GetNvlinks()), len(inv.GetNumaNodes()), dash(inv.GetDigest()))
				conditionTable(w, inv.GetConditions())
			})
		},
	}
	addTenantFlag(get, &tenant)
	cmd.AddCommand(get)
	return cmd
}

// nodeNames looks up the names of the commands' nodes, best effort (a
// node the caller may not read prints as its id): tables show the names
// operators typed.
func (a *app) nodeNames(ctx context.Context, items []*apiv1.Command) map[string]string {
	out := map[string]string{}
	c, err := a.client()
	if err != nil {
		return out
	}
	for _, cmd := range items {
		id := cmd.GetNodeId()
		if _, done := out[id]; done || id == "" {
			continue
		}
		out[id] = ""
		if n, err := c.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: cmd.GetTenantId(), Node: id})); err == nil {
			out[id] = n.Msg.GetNode().GetName()
		}
	}
	return out
}
