package fleet

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// NodeService serves the NodeService API.
type NodeService struct {
	env  *envelope.Envelope
	deps Deps
}

// NewNodeService returns the node handlers.
func NewNodeService(env *envelope.Envelope, deps Deps) *NodeService {
	return &NodeService{env: env, deps: deps}
}

var _ apiv1connect.NodeServiceHandler = (*NodeService)(nil)

var (
	nodeStates = []string{NodeJoining, NodeActive, NodeDraining, NodeDrained, NodeRetired}
	livenesses = []string{LivenessReady, LivenessUnreachable, LivenessLost}
)

// KindNodeDrain is the command that asks an agent to wind a node down; the
// gateway turns its success into the drained state.
const KindNodeDrain = "node.drain"

// List lists nodes of a tenant, or of every tenant for platform admins.
func (s *NodeService) List(ctx context.Context, req *connect.Request[apiv1.ListNodesRequest]) (*connect.Response[apiv1.ListNodesResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateTenant(&vs, msg.GetTenant())
	if msg.GetProject() != "" {
		if msg.GetTenant() == "" {
			vs.Add("project", "needs tenant")
		} else {
			vs.Ref("project", msg.GetProject(), "prj")
		}
	}
	validateOneOf(&vs, "state", msg.GetState(), nodeStates...)
	validateOneOf(&vs, "liveness", msg.GetLiveness(), livenesses...)
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := msg.GetTenant() + "/" + msg.GetProject() + "/" + msg.GetState() + "/" + msg.GetLiveness()
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	t, found, res, err := container(ctx, s.env, msg.GetTenant())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	if !found {
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", msg.GetTenant()))
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var (
		nodes     []Node
		conds     map[string][]NodeCondition
		projectID string
	)
	if err := s.env.Resolve(ctx, "nodes", func(ctx context.Context, q store.Querier) error {
		p := &NodeListParams{TenantID: t.ID, State: msg.GetState(), Liveness: msg.GetLiveness(), After: after, Limit: limit + 1}
		if msg.GetProject() != "" {
			proj, err := tenancy.ProjectGet(ctx, q, t.ID, msg.GetProject())
			if errors.Is(err, store.ErrNotFound) {
				return envelope.NotFound("project", msg.GetProject())
			}
			if err != nil {
				return err
			}
			p.ProjectID, projectID = proj.ID, proj.ID
		}
		var err error
		if nodes, err = NodeList(ctx, q, p); err != nil {
			return err
		}
		ids := make([]string, 0, len(nodes))
		for _, n := range nodes {
			ids = append(ids, n.ID)
		}
		conds, err = NodeConditionList(ctx, q, ids...)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListNodesResponse{}
	if len(nodes) > limit {
		// The cursor follows the rows read, not those shown.
		out.NextPageToken = envelope.EncodePageToken(nodes[limit-1].ID, filter)
		nodes = nodes[:limit]
	}
	// Nodes in a project are decided on it too, once per project, so a
	// policy forbidding a project hides its nodes as it does from Get.
	rf := s.env.NewReadFilter(res)
	if projectID != "" {
		if err := rf.RequireProject(ctx, t.ID, projectID); err != nil {
			return nil, err
		}
	}
	if nodes, err = envelope.KeepReadable(ctx, rf, nodes, func(n Node) (string, string) { return n.TenantID, n.ProjectID }); err != nil {
		return nil, err
	}
	for _, n := range nodes {
		out.Nodes = append(out.Nodes, NodeProto(n, conds[n.ID]))
	}
	return connect.NewResponse(out), nil
}

// Get reads one node.
func (s *NodeService) Get(ctx context.Context, req *connect.Request[apiv1.GetNodeRequest]) (*connect.Response[apiv1.GetNodeResponse], error) {
	var vs envelope.Violations
	validateTenant(&vs, req.Msg.GetTenant())
	validateNode(&vs, "node", req.Msg.GetNode())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		r     nodeRef
		conds map[string][]NodeCondition
	)
	if err := s.env.Resolve(ctx, "node", func(ctx context.Context, q store.Querier) (err error) {
		if r, err = lookupNode(ctx, q, req.Msg.GetTenant(), req.Msg.GetNode()); err != nil || !r.found {
			return err
		}
		conds, err = NodeConditionList(ctx, q, r.node.ID)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return nil, err
	}
	if err := r.notFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetNodeResponse{Node: NodeProto(r.node, conds[r.node.ID])}), nil
}

// Drain moves an active node to draining and sends its agent a node.drain
// command; the gateway marks the node drained when the agent is done.
func (s *NodeService) Drain(ctx context.Context, req *connect.Request[apiv1.DrainNodeRequest]) (*connect.Response[apiv1.DrainNodeResponse], error) {
	msg := req.Msg
	var r nodeRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DrainNodeResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateTenant(&vs, msg.GetTenant())
			validateNode(&vs, "node", msg.GetNode())
			vs.MaxLen("reason", msg.GetReason(), 200)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (res iam.Resource, err error) {
			r, err = lookupNode(ctx, q, msg.GetTenant(), msg.GetNode())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DrainNodeResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			n, err := NodeGet(ctx, tx, "", r.node.ID)
			if err != nil {
				return nil, err
			}
			params, err := paramsJSON(map[string]any{"reason": msg.GetReason()})
			if err != nil {
				return nil, err
			}
			cmd, err := s.drain(ctx, tx, &n, params, "", defaultDeadline)
			if err != nil {
				return nil, err
			}
			conds, err := NodeConditionList(ctx, tx, n.ID)
			if err != nil {
				return nil, err
			}
			return &apiv1.DrainNodeResponse{Node: NodeProto(n, conds[n.ID]), Command: CommandProto(cmd)}, nil
		},
	})
}

// drain moves n (as read in tx) from active to draining and queues the
// node.drain command.
func (s *NodeService) drain(ctx context.Context, tx *envelope.Tx, n *Node, params, idemKey string, deadline int32) (Command, error) {
	ok, err := NodeUpdateState(ctx, tx, &NodeUpdateStateParams{ID: n.ID, From: []string{NodeActive}, To: NodeDraining})
	if err != nil {
		return Command{}, err
	}
	if !ok {
		return Command{}, envelope.Errorf(envelope.CodeFailedPrecondition, "node %s is %s: only an active node can be drained", n.Name, n.State)
	}
	n.State = NodeDraining
	if err := s.deps.stateChanged(ctx, tx.Tx, n.ID); err != nil {
		return Command{}, err
	}
	tx.Emit(envelope.Event{Type: "node.draining", TenantID: n.TenantID, ResourceType: "Node", ResourceID: n.ID, Data: map[string]any{"name": n.Name}})
	return insertCommand(ctx, tx, s.deps, n, KindNodeDrain, params, idemKey, deadline)
}

// Undrain returns a draining or drained node to service and cancels its
// open node.drain commands.
func (s *NodeService) Undrain(ctx context.Context, req *connect.Request[apiv1.UndrainNodeRequest]) (*connect.Response[apiv1.UndrainNodeResponse], error) {
	msg := req.Msg
	var r nodeRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.UndrainNodeResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateTenant(&vs, msg.GetTenant())
			validateNode(&vs, "node", msg.GetNode())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (res iam.Resource, err error) {
			r, err = lookupNode(ctx, q, msg.GetTenant(), msg.GetNode())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.UndrainNodeResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			ok, err := NodeUpdateState(ctx, tx, &NodeUpdateStateParams{ID: r.node.ID, From: []string{NodeDraining, NodeDrained}, To: NodeActive})
			if err != nil {
				return nil, err
			}
			n, err := NodeGet(ctx, tx, "", r.node.ID)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "node %s is %s: only a draining or drained node can be undrained", n.Name, n.State)
			}
			if err := s.deps.stateChanged(ctx, tx.Tx, n.ID); err != nil {
				return nil, err
			}
			canceled, err := CommandCancel(ctx, tx, &CommandCancelParams{NodeID: n.ID, Kind: KindNodeDrain, Message: "node undrained"})
			if err != nil {
				return nil, err
			}
			if canceled > 0 {
				s.deps.notify(tx.Tx, n.ID)
			}
			tx.Emit(envelope.Event{Type: "node.undrained", TenantID: n.TenantID, ResourceType: "Node", ResourceID: n.ID,
				Data: map[string]any{"name": n.Name, "canceled_commands": canceled}})
			conds, err := NodeConditionList(ctx, tx, n.ID)
			if err != nil {
				return nil, err
			}
			return &apiv1.UndrainNodeResponse{Node: NodeProto(n, conds[n.ID])}, nil
		},
	})
}

// deletableStates are the states of nodes that hold no work: retired, or
// never adopted.
var deletableStates = []string{NodeRetired, NodeJoining}

// Delete forgets a retired or never-adopted node, then revokes its
// certificates.
func (s *NodeService) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteNodeRequest]) (*connect.Response[apiv1.DeleteNodeResponse], error) {
	msg := req.Msg
	var r nodeRef
	res, err := envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteNodeResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateTenant(&vs, msg.GetTenant())
			validateNode(&vs, "node", msg.GetNode())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (res iam.Resource, err error) {
			r, err = lookupNode(ctx, q, msg.GetTenant(), msg.GetNode())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteNodeResponse, error) {
			// Checked after the decision, so a stranger is refused as
			// always and nothing is deleted whose certificates stay valid.
			if s.deps.Revoker == nil {
				return nil, errNotWired("certificate revoker")
			}
			if err := r.notFound(); err != nil {
				return nil, err
			}
			ok, err := NodeDelete(ctx, tx, r.node.ID, deletableStates)
			if err != nil {
				return nil, err
			}
			if !ok {
				n, err := NodeGet(ctx, tx, "", r.node.ID)
				if err != nil {
					return nil, err
				}
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
					"node %s is %s: only retired nodes and nodes that never finished joining can be deleted", n.Name, n.State)
			}
			tx.Emit(envelope.Event{Type: "node.deleted", TenantID: r.node.TenantID, ResourceType: "Node", ResourceID: r.node.ID,
				Data: map[string]any{"name": r.node.Name}})
			return &apiv1.DeleteNodeResponse{}, nil
		},
	})
	if err != nil {
		return nil, err
	}
	// The revoker writes in its own transaction, which cannot run inside
	// ours (SQLite has one writer). The node is gone either way, and the
	// gateway admits no session for a node it cannot find; revocation makes
	// its certificates useless everywhere else too.
	n, err := s.deps.Revoker.RevokeNode(context.WithoutCancel(ctx), r.node.ID, "node deleted")
	if err != nil {
		return nil, s.env.Fail(ctx, &envelope.Error{Code: envelope.CodeUnavailable,
			Message: "node " + r.node.Name + " was deleted, but revoking its certificates failed; they expire on their own within a day",
			Err:     err})
	}
	res.Msg.RevokedCertificates = int32(n)
	return res, nil
}
