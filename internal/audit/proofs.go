package audit

import (
	"context"
	"errors"
	"math"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// logResource is the audit log an entry of tenantID belongs to; entries
// of no tenant are the platform's.
func logResource(tenantID string) iam.Resource {
	if tenantID == "" {
		return tenancy.PlatformResource()
	}
	return iam.Resource{Type: "AuditLog", ID: tenantID, TenantID: tenantID}
}

// authorizeScope decides the caller's read of checkpoints and keys, which
// cover every tenant's entries without showing any: on its own tenant's
// log for a tenant's principal, on the platform for a platform principal.
func (s *Service) authorizeScope(ctx context.Context) error {
	caller, _ := envelope.CallerFrom(ctx)
	return s.env.AuthorizeRead(ctx, logResource(caller.Principal.TenantID))
}

// signed fails when the deployment cannot sign checkpoints.
func (s *Service) signed() error {
	if s.log == nil || s.log.Origin() == "" {
		return envelope.Errorf(envelope.CodeFailedPrecondition, "the audit log has no checkpoint key: start the control plane with %s set", "BETTER_COMPUTE_SECRET")
	}
	return nil
}

func checkSize(vs *envelope.Violations, field string, n uint64) {
	if n > math.MaxInt64 {
		vs.Add(field, "must be at most %d, got %d", int64(math.MaxInt64), n)
	}
}

// logErr maps the tree's errors to API errors.
func logErr(err error, size uint64) error {
	switch {
	case errors.Is(err, ErrNoCheckpoint) && size == 0:
		return envelope.Errorf(envelope.CodeFailedPrecondition, "the audit log has no checkpoint yet: the sequencer signs the first once an entry is written")
	case errors.Is(err, ErrNoCheckpoint):
		return envelope.Errorf(envelope.CodeNotFound, "no checkpoint of size %d", size)
	case errors.Is(err, ErrNotCheckpointed):
		return &envelope.Error{Code: envelope.CodeFailedPrecondition, Message: "the entry is not in a signed checkpoint yet; retry after the next checkpoint (`audit checkpoint` shows the latest)", Err: err}
	}
	return err
}

// CheckpointProto is a checkpoint as the API shows it.
func CheckpointProto(cp Checkpoint) *apiv1.AuditCheckpoint {
	return &apiv1.AuditCheckpoint{Origin: cp.Origin, Size: cp.Size, RootHash: cp.Root, Note: string(cp.Note)}
}

// GetCheckpoint returns the latest checkpoint, or the one of a size.
func (s *Service) GetCheckpoint(ctx context.Context, req *connect.Request[apiv1.GetAuditCheckpointRequest]) (*connect.Response[apiv1.GetAuditCheckpointResponse], error) {
	var vs envelope.Violations
	checkSize(&vs, "size", req.Msg.GetSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.authorizeScope(ctx); err != nil {
		return nil, err
	}
	if err := s.signed(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	cp, err := s.log.Checkpoint(ctx, req.Msg.GetSize())
	if err != nil {
		return nil, s.env.Fail(ctx, logErr(err, req.Msg.GetSize()))
	}
	return connect.NewResponse(&apiv1.GetAuditCheckpointResponse{Checkpoint: CheckpointProto(cp)}), nil
}

// GetLogKey returns the checkpoints' public key.
func (s *Service) GetLogKey(ctx context.Context, _ *connect.Request[apiv1.GetAuditLogKeyRequest]) (*connect.Response[apiv1.GetAuditLogKeyResponse], error) {
	if err := s.authorizeScope(ctx); err != nil {
		return nil, err
	}
	if err := s.signed(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetAuditLogKeyResponse{Origin: s.log.Origin(), VerifierKey: s.log.Verifier()}), nil
}

// ProveInclusion proves an entry against a checkpoint. Another tenant's
// entry answers exactly as a missing one does.
func (s *Service) ProveInclusion(ctx context.Context, req *connect.Request[apiv1.ProveAuditInclusionRequest]) (*connect.Response[apiv1.ProveAuditInclusionResponse], error) {
	var vs envelope.Violations
	vs.ID("entry_id", req.Msg.GetEntryId(), "aud")
	checkSize(&vs, "checkpoint_size", req.Msg.GetCheckpointSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.signed(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	id := req.Msg.GetEntryId()
	notFound := envelope.NotFound("audit entry", id)
	var e envelope.AuditEntry
	if err := s.env.Resolve(ctx, "audit entry", func(ctx context.Context, q store.Querier) (err error) {
		e, err = entryGet(ctx, q, id)
		return err
	}); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			err = notFound
		}
		return nil, s.env.Fail(ctx, err)
	}
	// The decision on the entry's own log; a refusal is told as NOT_FOUND
	// so that an id from another tenant reveals nothing, not even that it
	// exists.
	res := logResource(e.TenantID)
	allowed, err := s.env.NewReadFilter(res).ReadableResource(ctx, res)
	if err != nil {
		return nil, err
	}
	if !allowed {
		return nil, s.env.Fail(ctx, notFound)
	}
	var p InclusionProof
	if err := s.env.Resolve(ctx, "audit proof", func(ctx context.Context, q store.Querier) (err error) {
		p, err = s.log.ProveInclusion(ctx, q, id, req.Msg.GetCheckpointSize())
		return err
	}); err != nil {
		if errors.Is(err, ErrNoEntry) {
			err = notFound
		}
		return nil, s.env.Fail(ctx, logErr(err, req.Msg.GetCheckpointSize()))
	}
	shown, err := DecodeLeaf(p.Leaf)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.ProveAuditInclusionResponse{Entry: EntryProto(shown), Leaf: p.Leaf, LeafIndex: p.LeafIndex,
		Proof: p.Hashes, Checkpoint: CheckpointProto(p.Checkpoint)}), nil
}

// ProveConsistency proves an older tree is a prefix of a checkpoint's.
func (s *Service) ProveConsistency(ctx context.Context, req *connect.Request[apiv1.ProveAuditConsistencyRequest]) (*connect.Response[apiv1.ProveAuditConsistencyResponse], error) {
	from, to := req.Msg.GetFromSize(), req.Msg.GetToSize()
	var vs envelope.Violations
	if from == 0 {
		vs.Add("from_size", "is required: the size of the checkpoint you kept")
	}
	checkSize(&vs, "from_size", from)
	checkSize(&vs, "to_size", to)
	if to != 0 && from > to {
		vs.Add("from_size", "must be at most to_size (%d), got %d", to, from)
	}
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.authorizeScope(ctx); err != nil {
		return nil, err
	}
	if err := s.signed(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var p ConsistencyProof
	if err := s.env.Resolve(ctx, "audit proof", func(ctx context.Context, q store.Querier) (err error) {
		p, err = s.log.ProveConsistency(ctx, q, from, to)
		return err
	}); err != nil {
		if errors.Is(err, ErrPastCheckpoint) {
			// A kept checkpoint larger than the latest: from another log,
			// or this log lost entries.
			err = envelope.Invalid(envelope.Violation{Field: "from_size", Reason: err.Error()})
		}
		return nil, s.env.Fail(ctx, logErr(err, to))
	}
	return connect.NewResponse(&apiv1.ProveAuditConsistencyResponse{Proof: p.Hashes, Checkpoint: CheckpointProto(p.Checkpoint)}), nil
}

// CheckLog runs the full check (platform principals).
func (s *Service) CheckLog(ctx context.Context, _ *connect.Request[apiv1.CheckAuditLogRequest]) (*connect.Response[apiv1.CheckAuditLogResponse], error) {
	if err := s.env.AuthorizeRead(ctx, tenancy.PlatformResource()); err != nil {
		return nil, err
	}
	if err := s.signed(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	rep, err := s.log.Check(ctx, s.log.Verifier())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.CheckAuditLogResponse{Entries: rep.Entries, Checkpoints: uint64(rep.Checkpoints)}
	if rep.Checkpoints > 0 {
		out.Latest = CheckpointProto(rep.Latest)
	}
	for _, p := range rep.Problems {
		out.Problems = append(out.Problems, &apiv1.AuditLogProblem{LeafIndex: p.LeafIndex, EntryId: p.EntryID, Reason: p.Reason})
	}
	return connect.NewResponse(out), nil
}
