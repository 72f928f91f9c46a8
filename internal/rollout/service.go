package rollout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// Service serves RolloutService on the envelope. Rollouts are platform
// objects: every call is decided on the Platform, which only platform
// operators reach.
type Service struct {
	env *envelope.Envelope
	m   *Module
}

// NewService returns the rollout handlers over the module.
func NewService(env *envelope.Envelope, m *Module) *Service { return &Service{env: env, m: m} }

var _ apiv1connect.RolloutServiceHandler = (*Service)(nil)

// Bounds of a rollout's settings.
const (
	maxPauseBetween = 7 * 24 * time.Hour
	maxSoak         = 24 * time.Hour
	minRevertAfter  = 30 * time.Second
	maxRevertAfter  = time.Hour
	maxUnavailable  = 10000
)

func platform() iam.Resource { return iam.Resource{Type: "Platform", ID: iam.PlatformID} }

func validateDuration(vs *envelope.Violations, field string, d *durationpb.Duration, lo, hi time.Duration) {
	if d == nil {
		return
	}
	if err := d.CheckValid(); err != nil {
		vs.Add(field, "is not a valid duration")
		return
	}
	v := d.AsDuration()
	if v%time.Second != 0 {
		vs.Add(field, "must be whole seconds")
		return
	}
	if v < lo || v > hi {
		vs.Add(field, "must be from %s to %s", lo, hi)
	}
}

func durationOr(d *durationpb.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.AsDuration()
}

func validateID(vs *envelope.Violations, id string) {
	if id == "" {
		vs.Add("id", "is required")
		return
	}
	vs.ID("id", id, IDPrefix)
}

// poolRef is the request's pool, resolved before the decision.
type poolRef struct {
	pool  pool.Pool
	found bool
	many  int
}

func lookupPool(ctx context.Context, q store.Querier, ref string) (poolRef, error) {
	if strings.HasPrefix(ref, pool.IDPrefix+"_") {
		p, err := pool.Get(ctx, q, "", ref)
		if errors.Is(err, store.ErrNotFound) {
			return poolRef{}, nil
		}
		return poolRef{pool: p, found: err == nil}, err
	}
	ps, err := pool.ByName(ctx, q, ref)
	if err != nil || len(ps) == 0 {
		return poolRef{}, err
	}
	return poolRef{pool: ps[0], found: len(ps) == 1, many: len(ps)}, nil
}

func (r poolRef) err(ref string) error {
	if r.many > 1 {
		return envelope.Invalid(envelope.Violation{Field: "pool", Reason: fmt.Sprintf("%d tenants have a pool named %q: give its %s_ id", r.many, ref, pool.IDPrefix)})
	}
	if !r.found {
		return envelope.Invalid(envelope.Violation{Field: "pool", Reason: fmt.Sprintf("no pool %q", ref)})
	}
	return nil
}

// Create starts a rollout: the pool's nodes are fixed now, by name, and
// assigned to waves.
func (s *Service) Create(ctx context.Context, req *connect.Request[apiv1.CreateRolloutRequest]) (*connect.Response[apiv1.CreateRolloutResponse], error) {
	msg := req.Msg
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateRolloutResponse]{
		Validate: func() error {
			var vs envelope.Violations
			if msg.GetRelease() == "" {
				vs.Add("release", "is required: a published release's version (v1.4.0)")
			} else {
				vs.MaxLen("release", msg.GetRelease(), 128)
			}
			if msg.GetPool() == "" {
				vs.Add("pool", "is required")
			} else {
				vs.MaxLen("pool", msg.GetPool(), 256)
			}
			if _, err := ParseWaves(msg.GetWaves(), 1); err != nil {
				vs.Add("waves", "%s", err.Error())
			}
			if mu := msg.GetMaxUnavailable(); mu < 0 || mu > maxUnavailable {
				vs.Add("max_unavailable", "must be from 1 to %d (0 takes 1)", maxUnavailable)
			}
			validateDuration(&vs, "pause_between", msg.GetPauseBetween(), 0, maxPauseBetween)
			validateDuration(&vs, "soak", msg.GetSoak(), 0, maxSoak)
			validateDuration(&vs, "revert_after", msg.GetRevertAfter(), minRevertAfter, maxRevertAfter)
			return vs.Err()
		},
		Draft: func(context.Context, store.Querier) (iam.Resource, error) { return platform(), nil },
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateRolloutResponse, error) {
			rel, err := s.m.release(ctx, tx, msg.GetRelease())
			if errors.Is(err, ErrReleaseNotFound) {
				return nil, envelope.Invalid(envelope.Violation{Field: "release", Reason: fmt.Sprintf("no published release %q (better-compute releases list)", msg.GetRelease())})
			}
			if err != nil {
				return nil, err
			}
			pr, err := lookupPool(ctx, tx, msg.GetPool())
			if err != nil {
				return nil, err
			}
			if err := pr.err(msg.GetPool()); err != nil {
				return nil, err
			}
			ids, err := pool.NodeIDs(ctx, tx, pr.pool.ID)
			if err != nil {
				return nil, err
			}
			if len(ids) == 0 {
				return nil, envelope.Invalid(envelope.Violation{Field: "pool", Reason: fmt.Sprintf("pool %s has no nodes", pr.pool.Name)})
			}
			nodes := make([]fleet.Node, 0, len(ids))
			for _, id := range ids {
				n, err := fleet.NodeGet(ctx, tx, "", id)
				if err != nil {
					return nil, err
				}
				nodes = append(nodes, n)
			}
			slices.SortFunc(nodes, func(a, b fleet.Node) int { return strings.Compare(a.Name, b.Name) })
			sizes, err := ParseWaves(msg.GetWaves(), len(nodes))
			if err != nil {
				return nil, envelope.Invalid(envelope.Violation{Field: "waves", Reason: err.Error()})
			}
			now := tx.Now().UTC()
			r := Rollout{ID: envelope.NewID(IDPrefix, now), Release: rel.Version, PoolID: pr.pool.ID, PoolName: pr.pool.Name,
				Waves: msg.GetWaves(), WaveNodes: sizes, MaxUnavailable: max(1, int(msg.GetMaxUnavailable())),
				PauseBetween: durationOr(msg.GetPauseBetween(), 0), Soak: durationOr(msg.GetSoak(), DefaultSoak),
				Revert: durationOr(msg.GetRevertAfter(), DefaultRevertAfter), State: StateRunning,
				CreatedBy: tx.Caller().Principal.ID, CreateTime: now, UpdateTime: now}
			if err := RolloutInsert(ctx, tx, &r); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s already has an active rollout: pause, abort or let it finish first", pr.pool.Name)
				}
				return nil, err
			}
			i := 0
			for w, size := range sizes {
				for range size {
					n := nodes[i]
					if err := NodeInsert(ctx, tx, &Node{RolloutID: r.ID, NodeID: n.ID, NodeName: n.Name, Wave: w,
						FromVersion: n.AgentVersion, State: NodePending, UpdateTime: now}); err != nil {
						return nil, err
					}
					i++
				}
			}
			tx.SetResource(r.ID, "")
			if err := s.m.event(ctx, tx, "rollout.created", &r, now, map[string]any{"waves": r.Waves, "wave_nodes": sizes, "nodes": len(nodes)}); err != nil {
				return nil, err
			}
			if err := s.m.wake(ctx, tx); err != nil {
				return nil, err
			}
			out, err := s.proto(ctx, tx, r, true)
			return &apiv1.CreateRolloutResponse{Rollout: out}, err
		},
	})
}

// Get reads a rollout with its nodes.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetRolloutRequest]) (*connect.Response[apiv1.GetRolloutResponse], error) {
	var vs envelope.Violations
	validateID(&vs, req.Msg.GetId())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, platform()); err != nil {
		return nil, err
	}
	var out *apiv1.Rollout
	if err := s.env.Resolve(ctx, "rollout", func(ctx context.Context, q store.Querier) error {
		r, err := RolloutGet(ctx, q, req.Msg.GetId())
		if errors.Is(err, store.ErrNotFound) {
			return envelope.NotFound("rollout", req.Msg.GetId())
		}
		if err != nil {
			return err
		}
		out, err = s.proto(ctx, q, r, true)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetRolloutResponse{Rollout: out}), nil
}

// List lists rollouts, newest id last.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListRolloutsRequest]) (*connect.Response[apiv1.ListRolloutsResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	if st := msg.GetState(); st != "" && !slices.Contains(States, st) {
		vs.Add("state", "must be one of %s", strings.Join(States, ", "))
	}
	vs.MaxLen("pool", msg.GetPool(), 256)
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := msg.GetPool() + "/" + msg.GetState()
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, platform()); err != nil {
		return nil, err
	}
	limit := envelope.PageSize(msg.GetPageSize())
	resp := &apiv1.ListRolloutsResponse{}
	if err := s.env.Resolve(ctx, "rollouts", func(ctx context.Context, q store.Querier) error {
		poolID := ""
		if msg.GetPool() != "" {
			pr, err := lookupPool(ctx, q, msg.GetPool())
			if err != nil {
				return err
			}
			if err := pr.err(msg.GetPool()); err != nil {
				return err
			}
			poolID = pr.pool.ID
		}
		rs, err := RolloutList(ctx, q, ListParams{PoolID: poolID, State: msg.GetState(), After: after, Limit: limit + 1})
		if err != nil {
			return err
		}
		if len(rs) > limit {
			resp.NextPageToken = envelope.EncodePageToken(rs[limit-1].ID, filter)
			rs = rs[:limit]
		}
		for _, r := range rs {
			p, err := s.proto(ctx, q, r, false)
			if err != nil {
				return err
			}
			resp.Rollouts = append(resp.Rollouts, p)
		}
		return nil
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(resp), nil
}

// transition moves a rollout from one of from to to, with its event.
func (s *Service) transition(ctx context.Context, tx *envelope.Tx, id string, from []string, to, event, verb string) (*apiv1.Rollout, error) {
	r, err := RolloutGetForUpdate(ctx, tx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, envelope.NotFound("rollout", id)
	}
	if err != nil {
		return nil, err
	}
	if !slices.Contains(from, r.State) {
		return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "rollout %s is %s: only a %s rollout can be %s", r.ID, r.State, strings.Join(from, " or "), verb)
	}
	now := tx.Now().UTC()
	r.State, r.UpdateTime = to, now
	if to == StateAborted {
		r.EndTime = &now
		r.Message = "aborted by " + tx.Caller().Principal.ID
	}
	if err := RolloutUpdate(ctx, tx, &r); err != nil {
		return nil, err
	}
	if err := s.m.event(ctx, tx, event, &r, now, map[string]any{"by": tx.Caller().Principal.ID}); err != nil {
		return nil, err
	}
	if to == StateRunning {
		if err := s.m.wake(ctx, tx); err != nil {
			return nil, err
		}
	}
	return s.proto(ctx, tx, r, true)
}

func (s *Service) idMutation(id string) (func() error, func(context.Context, store.Querier) (iam.Resource, error)) {
	return func() error {
			var vs envelope.Violations
			validateID(&vs, id)
			return vs.Err()
		}, func(context.Context, store.Querier) (iam.Resource, error) {
			return platform(), nil
		}
}

// Pause stops sending upgrades; commands in flight finish.
func (s *Service) Pause(ctx context.Context, req *connect.Request[apiv1.PauseRolloutRequest]) (*connect.Response[apiv1.PauseRolloutResponse], error) {
	validate, draft := s.idMutation(req.Msg.GetId())
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.PauseRolloutResponse]{Validate: validate, Draft: draft,
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.PauseRolloutResponse, error) {
			r, err := s.transition(ctx, tx, req.Msg.GetId(), []string{StateRunning}, StatePaused, "rollout.paused", "paused")
			return &apiv1.PauseRolloutResponse{Rollout: r}, err
		}})
}

// Resume continues a paused rollout.
func (s *Service) Resume(ctx context.Context, req *connect.Request[apiv1.ResumeRolloutRequest]) (*connect.Response[apiv1.ResumeRolloutResponse], error) {
	validate, draft := s.idMutation(req.Msg.GetId())
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.ResumeRolloutResponse]{Validate: validate, Draft: draft,
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.ResumeRolloutResponse, error) {
			r, err := s.transition(ctx, tx, req.Msg.GetId(), []string{StatePaused}, StateRunning, "rollout.resumed", "resumed")
			return &apiv1.ResumeRolloutResponse{Rollout: r}, err
		}})
}

// Abort ends a rollout where it stands: nothing more is sent, nothing is
// rolled back.
func (s *Service) Abort(ctx context.Context, req *connect.Request[apiv1.AbortRolloutRequest]) (*connect.Response[apiv1.AbortRolloutResponse], error) {
	validate, draft := s.idMutation(req.Msg.GetId())
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.AbortRolloutResponse]{Validate: validate, Draft: draft,
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.AbortRolloutResponse, error) {
			r, err := s.transition(ctx, tx, req.Msg.GetId(), ActiveStates, StateAborted, "rollout.aborted", "aborted")
			return &apiv1.AbortRolloutResponse{Rollout: r}, err
		}})
}

func ts(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

// proto is a rollout as the API shows it; withNodes adds its nodes.
func (s *Service) proto(ctx context.Context, q store.Querier, r Rollout, withNodes bool) (*apiv1.Rollout, error) {
	out := &apiv1.Rollout{Id: r.ID, Release: r.Release, PoolId: r.PoolID, Pool: r.PoolName, Waves: r.Waves,
		MaxUnavailable: int32(r.MaxUnavailable), PauseBetween: durationpb.New(r.PauseBetween), Soak: durationpb.New(r.Soak),
		RevertAfter: durationpb.New(r.Revert), State: r.State, CurrentWave: int32(r.CurrentWave), Message: r.Message,
		CreatedBy: r.CreatedBy, CreateTime: timestamppb.New(r.CreateTime), UpdateTime: timestamppb.New(r.UpdateTime), EndTime: ts(r.EndTime),
		NodeStates: map[string]int32{}}
	for _, n := range r.WaveNodes {
		out.WaveNodes = append(out.WaveNodes, int32(n))
	}
	counts, err := NodeStateCounts(ctx, q, r.ID)
	if err != nil {
		return nil, err
	}
	for k, v := range counts {
		out.NodeStates[k] = int32(v)
	}
	if !withNodes {
		return out, nil
	}
	nodes, err := NodeList(ctx, q, r.ID, -1)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		out.Nodes = append(out.Nodes, &apiv1.RolloutNode{NodeId: n.NodeID, Node: n.NodeName, Wave: int32(n.Wave), FromVersion: n.FromVersion,
			State: n.State, CommandId: n.CommandID, RollbackCommandId: n.RollbackCmdID, Message: n.Message, UpdateTime: timestamppb.New(n.UpdateTime)})
	}
	return out, nil
}
