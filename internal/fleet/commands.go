package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// CommandService serves the CommandService API.
type CommandService struct {
	env  *envelope.Envelope
	deps Deps
	node *NodeService
}

// NewCommandService returns the command handlers.
func NewCommandService(env *envelope.Envelope, deps Deps) *CommandService {
	return &CommandService{env: env, deps: deps, node: NewNodeService(env, deps)}
}

var _ apiv1connect.CommandServiceHandler = (*CommandService)(nil)

// KindInventoryRefresh asks an agent to send its inventory again.
const KindInventoryRefresh = "inventory.refresh"

// APICommandKinds are the kinds a caller may run through the API; the rest
// (allocation.*) are issued by the control plane itself.
var APICommandKinds = []string{KindInventoryRefresh, KindNodeDrain}

var commandStates = []string{CommandPending, CommandDelivered, CommandAccepted, CommandRunning,
	CommandSucceeded, CommandFailed, CommandCanceled, CommandExpired}

// Deadlines of commands, in seconds.
const (
	defaultDeadline = 300
	maxDeadline     = 86400
	maxParamsBytes  = 16 << 10
)

// CommandResource projects a command into the authorization model; projectID
// is its node's project.
func CommandResource(c Command, projectID string) iam.Resource {
	return iam.Resource{Type: "Command", ID: c.ID, TenantID: c.TenantID, ProjectID: projectID, Attrs: map[string]any{"kind": c.Kind}}
}

// Run queues a command for a node.
func (s *CommandService) Run(ctx context.Context, req *connect.Request[apiv1.RunCommandRequest]) (*connect.Response[apiv1.RunCommandResponse], error) {
	msg := req.Msg
	var (
		r      nodeRef
		params string
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.RunCommandResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateTenant(&vs, msg.GetTenant())
			validateNode(&vs, "node", msg.GetNode())
			_, destructive := Destructive(msg.GetKind())
			switch {
			case msg.GetKind() == "":
				vs.Add("kind", "is required: %s", strings.Join(APICommandKinds, " or "))
			case destructive:
				// Refused after the decision, with its own code: the kind is
				// right, only the way to run it is not.
			case !slices.Contains(APICommandKinds, msg.GetKind()):
				vs.Add("kind", "must be %s, got %q", strings.Join(APICommandKinds, " or "), truncate(msg.GetKind()))
			}
			if d := msg.GetDeadlineSeconds(); d < 0 || d > maxDeadline {
				vs.Add("deadline_seconds", "must be between 1 and %d (0 means %d)", maxDeadline, defaultDeadline)
			}
			var err error
			if params, err = structJSON(msg.GetParams()); err != nil {
				vs.Add("params", "must be a JSON object: %v", err)
			} else if len(params) > maxParamsBytes {
				vs.Add("params", "must be at most %d bytes as JSON, got %d", maxParamsBytes, len(params))
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if r, err = lookupNode(ctx, q, msg.GetTenant(), msg.GetNode()); err != nil || !r.found {
				return iam.Resource{Type: "Command", ID: iam.DraftID, TenantID: r.tenant.ID, Attrs: map[string]any{"kind": msg.GetKind()}}, err
			}
			return iam.Resource{Type: "Command", ID: iam.DraftID, TenantID: r.node.TenantID, ProjectID: r.node.ProjectID,
				Attrs: map[string]any{"kind": msg.GetKind()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.RunCommandResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			if _, ok := Destructive(msg.GetKind()); ok {
				return nil, envelope.Errorf(envelope.CodeQuorumRequired,
					"command kind %s is destructive: it runs only in a command batch approved by a quorum of the tenant's approvers "+
						"(better-compute batches create, then commands run --batch ID)", msg.GetKind())
			}
			n, err := NodeGet(ctx, tx, "", r.node.ID)
			if err != nil {
				return nil, err
			}
			if n.State == NodeRetired {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "node %s is retired: it takes no commands", n.Name)
			}
			if err := CheckKindForMode(n.Mode, msg.GetKind()); err != nil {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "node %s (%s): %v", n.Name, cmp.Or(n.Mode, RoleNode), err)
			}
			// The envelope answers a replay from its own table; the key also
			// goes on the row (per principal, as the envelope scopes it), so
			// the node's uniqueness backs it up.
			idemKey := ""
			if k := req.Header().Get(envelope.HeaderIdempotencyKey); k != "" {
				idemKey = tx.Caller().Principal.ID + ":" + k
			}
			var cmd Command
			if msg.GetKind() == KindNodeDrain {
				cmd, err = s.node.drain(ctx, tx, &n, params, idemKey, msg.GetDeadlineSeconds())
			} else {
				cmd, err = insertCommand(ctx, tx, s.deps, &n, msg.GetKind(), params, idemKey, msg.GetDeadlineSeconds())
			}
			if err != nil {
				return nil, err
			}
			return &apiv1.RunCommandResponse{Command: CommandProto(cmd)}, nil
		},
	})
}

// insertCommand inserts a pending command for n, wakes the node's session
// once the transaction commits, and records the event. A key the node
// already used answers the stored command when it asked for the same kind
// and params (nothing is written), and IDEMPOTENCY_KEY_REUSED otherwise.
func insertCommand(ctx context.Context, tx *envelope.Tx, deps Deps, n *Node, kind, params, idemKey string, deadline int32) (Command, error) {
	if deadline == 0 {
		deadline = defaultDeadline
	}
	now := tx.Now()
	span, traceparent := startSend(ctx, kind, n.ID)
	cmd, inserted, err := CommandInsert(ctx, tx, &CommandInsertParams{
		ID: envelope.NewID(CommandIDPrefix, now), TenantID: n.TenantID, NodeID: n.ID, Kind: kind, Params: params,
		IdempotencyKey: idemKey, Traceparent: traceparent, CreatedBy: tx.Caller().Principal.ID,
		Deadline: now.Add(time.Duration(deadline) * time.Second), CreateTime: now, Signer: deps.Signer,
	})
	endSend(span, cmd, inserted)
	if err != nil {
		return Command{}, err
	}
	if !inserted {
		if !sameCommand(cmd, kind, params) {
			return Command{}, envelope.Errorf(envelope.CodeIdempotencyKeyReused,
				"Idempotency-Key was used for a different command on node %s (%s)", n.Name, cmd.ID)
		}
		tx.SetResource(cmd.ID, "")
		return cmd, nil
	}
	deps.notify(tx.Tx, n.ID)
	tx.SetResource(cmd.ID, "")
	tx.Emit(envelope.Event{Type: "command.created", TenantID: n.TenantID, ResourceType: "Command", ResourceID: cmd.ID,
		Data: map[string]any{"node_id": n.ID, "kind": kind, "seq": cmd.Seq}})
	return cmd, nil
}

// sameCommand reports whether a stored command is what a repeat asks for.
func sameCommand(c Command, kind, params string) bool {
	if c.Kind != kind {
		return false
	}
	var a, b any
	if json.Unmarshal([]byte(c.Params), &a) != nil || json.Unmarshal([]byte(cmp.Or(params, "{}")), &b) != nil {
		return c.Params == params
	}
	return reflect.DeepEqual(a, b)
}

// lookupCommand resolves a command (and its node's project) for a draft or
// a read; misses are not errors yet.
func lookupCommand(ctx context.Context, q store.Querier, tenantRef, id string) (t tenancy.Tenant, c Command, projectID string, found bool, err error) {
	if tenantRef != "" {
		var tfound bool
		if t, tfound, err = tenancy.LookupTenant(ctx, q, tenantRef); err != nil || !tfound {
			return t, c, "", false, err
		}
	}
	c, err = CommandGet(ctx, q, t.ID, id)
	if errors.Is(err, store.ErrNotFound) {
		return t, c, "", false, nil
	}
	if err != nil {
		return t, c, "", false, err
	}
	n, err := NodeGet(ctx, q, "", c.NodeID)
	if err != nil {
		return t, c, "", false, err
	}
	return t, c, n.ProjectID, true, nil
}

// Get reads one command.
func (s *CommandService) Get(ctx context.Context, req *connect.Request[apiv1.GetCommandRequest]) (*connect.Response[apiv1.GetCommandResponse], error) {
	var vs envelope.Violations
	validateTenant(&vs, req.Msg.GetTenant())
	vs.ID("id", req.Msg.GetId(), CommandIDPrefix)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t       tenancy.Tenant
		c       Command
		project string
		found   bool
	)
	if err := s.env.Resolve(ctx, "command", func(ctx context.Context, q store.Querier) (err error) {
		t, c, project, found, err = lookupCommand(ctx, q, req.Msg.GetTenant(), req.Msg.GetId())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	res := CommandResource(c, project)
	if !found {
		res = iam.Resource{Type: "Command", ID: "unknown", TenantID: t.ID}
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	if !found {
		if req.Msg.GetTenant() != "" && t.ID == "" {
			return nil, s.env.Fail(ctx, envelope.NotFound("tenant", req.Msg.GetTenant()))
		}
		return nil, s.env.Fail(ctx, envelope.NotFound("command", req.Msg.GetId()))
	}
	return connect.NewResponse(&apiv1.GetCommandResponse{Command: CommandProto(c)}), nil
}

// List lists commands of a node, a tenant, or (platform admins) everyone.
func (s *CommandService) List(ctx context.Context, req *connect.Request[apiv1.ListCommandsRequest]) (*connect.Response[apiv1.ListCommandsResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateTenant(&vs, msg.GetTenant())
	if msg.GetNode() != "" {
		validateNode(&vs, "node", msg.GetNode())
	}
	validateOneOf(&vs, "state", msg.GetState(), commandStates...)
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := msg.GetTenant() + "/" + msg.GetNode() + "/" + msg.GetState()
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		tenantID, nodeID string
		res              iam.Resource
		missing          error
	)
	if msg.GetNode() != "" {
		var r nodeRef
		if err := s.env.Resolve(ctx, "node", func(ctx context.Context, q store.Querier) (err error) {
			r, err = lookupNode(ctx, q, msg.GetTenant(), msg.GetNode())
			return err
		}); err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		res, missing, tenantID, nodeID = r.resource(), r.notFound(), r.node.TenantID, r.node.ID
	} else {
		t, found, cres, err := container(ctx, s.env, msg.GetTenant())
		if err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		res, tenantID = cres, t.ID
		if !found {
			missing = envelope.NotFound("tenant", msg.GetTenant())
		}
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	if missing != nil {
		return nil, s.env.Fail(ctx, missing)
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var (
		cmds []Command
		// A command sits in its node's project.
		projects = map[string]string{}
	)
	if err := s.env.Resolve(ctx, "commands", func(ctx context.Context, q store.Querier) (err error) {
		if cmds, err = CommandList(ctx, q, &CommandListParams{TenantID: tenantID, NodeID: nodeID, State: msg.GetState(), After: after, Limit: limit + 1}); err != nil {
			return err
		}
		for _, c := range cmds {
			if _, ok := projects[c.NodeID]; ok {
				continue
			}
			n, err := NodeGet(ctx, q, "", c.NodeID)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			projects[c.NodeID] = n.ProjectID
		}
		return nil
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListCommandsResponse{}
	if len(cmds) > limit {
		// The cursor follows the rows read, not those shown.
		out.NextPageToken = envelope.EncodePageToken(cmds[limit-1].ID, filter)
		cmds = cmds[:limit]
	}
	// Commands of a node in a project are decided on the project too, once
	// per project, so a policy forbidding a project hides them as Get does.
	cmds, err = envelope.KeepReadable(ctx, s.env.NewReadFilter(res), cmds, func(c Command) (string, string) { return c.TenantID, projects[c.NodeID] })
	if err != nil {
		return nil, err
	}
	for _, c := range cmds {
		out.Commands = append(out.Commands, CommandProto(c))
	}
	return connect.NewResponse(out), nil
}

// Cancel cancels a command that has not finished; the node's session is
// woken to tell the agent.
func (s *CommandService) Cancel(ctx context.Context, req *connect.Request[apiv1.CancelCommandRequest]) (*connect.Response[apiv1.CancelCommandResponse], error) {
	msg := req.Msg
	var (
		t       tenancy.Tenant
		c       Command
		project string
		found   bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CancelCommandResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateTenant(&vs, msg.GetTenant())
			vs.ID("id", msg.GetId(), CommandIDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (res iam.Resource, err error) {
			if t, c, project, found, err = lookupCommand(ctx, q, msg.GetTenant(), msg.GetId()); err != nil || !found {
				return iam.Resource{Type: "Command", ID: "unknown", TenantID: t.ID}, err
			}
			return CommandResource(c, project), nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CancelCommandResponse, error) {
			if !found {
				if msg.GetTenant() != "" && t.ID == "" {
					return nil, envelope.NotFound("tenant", msg.GetTenant())
				}
				return nil, envelope.NotFound("command", msg.GetId())
			}
			n, err := CommandCancel(ctx, tx, &CommandCancelParams{ID: c.ID, Message: "canceled by " + tx.Caller().Principal.ID})
			if err != nil {
				return nil, err
			}
			cur, err := CommandGet(ctx, tx, "", c.ID)
			if err != nil {
				return nil, err
			}
			if n == 0 {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "command %s is already %s", c.ID, cur.State)
			}
			s.deps.notify(tx.Tx, c.NodeID)
			tx.Emit(envelope.Event{Type: "command.canceled", TenantID: c.TenantID, ResourceType: "Command", ResourceID: c.ID,
				Data: map[string]any{"node_id": c.NodeID, "kind": c.Kind}})
			return &apiv1.CancelCommandResponse{Command: CommandProto(cur)}, nil
		},
	})
}

// structJSON encodes a request's Struct as the JSON text of a params column.
func structJSON(st *structpb.Struct) (string, error) {
	if st == nil || len(st.GetFields()) == 0 {
		return "{}", nil
	}
	b, err := protojson.Marshal(st)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// paramsJSON encodes params the control plane builds itself.
func paramsJSON(m map[string]any) (string, error) {
	b, err := json.Marshal(m)
	return string(b), err
}

// MaxCommandParamsBytes bounds a command's params as JSON, so that every
// command fits the agent protocol's 4 MiB frame with room to spare.
const MaxCommandParamsBytes = 1 << 20

// ErrCommandUnencodable says a command's params cannot travel to an agent:
// not a JSON object, not representable as a protobuf Struct, or larger than
// MaxCommandParamsBytes. Such a command is refused when it is sent and
// failed (never left pending) when it is found at delivery.
var ErrCommandUnencodable = errors.New("command params cannot be encoded for the agent")

// ErrCommandKeyReused says a node's command idempotency key was used before
// for a different kind or params.
var ErrCommandKeyReused = errors.New("command idempotency key was used for a different command")

// ErrCommandFenced says a command must not reach its agent any more: it
// was sent under a site's boot-lease epoch that has passed. A pending one
// is failed with CommandFailFenced instead of delivered.
var ErrCommandFenced = errors.New("command fenced")

// CommandFailFenced is the failure code of a command fenced before it was
// delivered (ErrCommandFenced).
const CommandFailFenced = "STALE_EPOCH"

// CommandFailUnencodable is the failure code of a command the gateway
// failed because it cannot be encoded.
const CommandFailUnencodable = "UNENCODABLE"

// CommandParamsStruct decodes a command's params column into the Struct
// the agent protocol carries. The send path and the gateway's delivery
// both use it, so a command that would not encode is never stored.
func CommandParamsStruct(params string) (*structpb.Struct, error) {
	if len(params) > MaxCommandParamsBytes {
		return nil, fmt.Errorf("%w: %d bytes of JSON, at most %d", ErrCommandUnencodable, len(params), MaxCommandParamsBytes)
	}
	var m map[string]any
	if params != "" {
		if err := json.Unmarshal([]byte(params), &m); err != nil {
			return nil, fmt.Errorf("%w: not a JSON object: %w", ErrCommandUnencodable, err)
		}
	}
	st, err := structpb.NewStruct(m)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCommandUnencodable, err)
	}
	return st, nil
}

// SystemCommand is a command another module sends a node on the control
// plane's own account (capacity's allocation.bind), not a caller's.
type SystemCommand struct {
	TenantID, NodeID, Kind string
	Params                 map[string]any
	IdempotencyKey         string
	CreatedBy              string
	TTL                    time.Duration
	// Time is the control plane clock's now.
	Time time.Time
	// Signer signs it (see CommandInsertParams.Signer).
	Signer CommandSigner
}

// SendSystemCommand persists a command in the caller's transaction with the
// node's next sequence number and wakes the node's session once it commits.
// A repeated idempotency key returns the command already stored (nothing is
// written, the transaction stays usable), or ErrCommandKeyReused when that
// command has another kind or params. Params that cannot be encoded for the
// agent are refused at once with ErrCommandUnencodable, and nothing is
// written.
func SendSystemCommand(ctx context.Context, tx store.Tx, notifier CommandNotifier, c SystemCommand) (string, error) {
	params, err := paramsJSON(c.Params)
	if err == nil {
		_, err = CommandParamsStruct(params)
	} else {
		err = fmt.Errorf("%w: %w", ErrCommandUnencodable, err)
	}
	if err != nil {
		return "", fmt.Errorf("fleet: %s command for node %s: %w", c.Kind, c.NodeID, err)
	}
	if c.TTL <= 0 {
		c.TTL = defaultDeadline * time.Second
	}
	at := c.Time.UTC()
	span, traceparent := startSend(ctx, c.Kind, c.NodeID)
	cmd, inserted, err := CommandInsert(ctx, tx, &CommandInsertParams{
		ID: envelope.NewID(CommandIDPrefix, at), TenantID: c.TenantID, NodeID: c.NodeID, Kind: c.Kind, Params: params,
		IdempotencyKey: c.IdempotencyKey, Traceparent: traceparent, CreatedBy: c.CreatedBy, Deadline: at.Add(c.TTL), CreateTime: at,
		Signer: c.Signer,
	})
	endSend(span, cmd, inserted)
	if err != nil {
		return "", err
	}
	if !inserted {
		if !sameCommand(cmd, c.Kind, params) {
			return "", fmt.Errorf("fleet: %s command for node %s, key %q (stored as %s): %w", c.Kind, c.NodeID, c.IdempotencyKey, cmd.ID, ErrCommandKeyReused)
		}
		return cmd.ID, nil
	}
	if notifier != nil {
		notifier.NotifyCommand(tx, c.NodeID)
	}
	return cmd.ID, nil
}

// Command kinds of the commissioning ramdisk (bcd --mode ramdisk).
const (
	KindDiskWipe    = "disk.wipe"
	KindImageWrite  = "image.write"
	KindLogsCollect = "logs.collect"
	// KindConfigure writes the deployed OS's join settings onto its disk;
	// KindBurnIn is the commissioning health pass.
	KindConfigure = "machine.configure"
	KindBurnIn    = "burnin.run"
)

// RamdiskCommandKinds are all a ramdisk node runs; the ones besides
// inventory.refresh are ramdisk-only: a node never gets them (a disk.wipe
// on a host that runs tenants' work would destroy it).
var RamdiskCommandKinds = []string{KindInventoryRefresh, KindDiskWipe, KindImageWrite, KindConfigure, KindBurnIn, KindLogsCollect}

// CommandFailWrongRole is the failure code of a command the gateway failed
// because its kind is not for the role of the node's certificate.
const CommandFailWrongRole = "WRONG_ROLE"

// SiteCommandKinds are the site agent's own kinds (bcd --mode site): BMC
// calls and the site's machine list. Only a site agent gets them — a BMC
// password never goes to a node or a ramdisk.
var SiteCommandKinds = []string{"bmc.power", "bmc.rotate", "site.machines"}

// CheckKindForMode refuses a command kind the agent's mode must not run: a
// node kind for a ramdisk, a ramdisk-only kind for a node, a site kind for
// either. What else a site agent refuses is its own to check.
func CheckKindForMode(mode, kind string) error {
	ramdiskKind := slices.Contains(RamdiskCommandKinds, kind)
	mode = cmp.Or(mode, RoleNode)
	if slices.Contains(SiteCommandKinds, kind) && mode != RoleSite {
		return fmt.Errorf("command kind %q runs only on a site agent, not on a %s", kind, mode)
	}
	switch mode {
	case RoleRamdisk:
		if !ramdiskKind {
			return fmt.Errorf("command kind %q is not a ramdisk command: a ramdisk runs only %s", kind, strings.Join(RamdiskCommandKinds, ", "))
		}
	case RoleNode:
		if ramdiskKind && kind != KindInventoryRefresh {
			return fmt.Errorf("command kind %q runs only in a commissioning ramdisk, not on a node", kind)
		}
	}
	return nil
}
