package quorum

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/crypto/ssh"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/quorum/approval"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Limits of a batch and of an approver set.
const (
	// MaxPayloadBytes bounds a batch's params (canonical JSON) in total.
	MaxPayloadBytes = 8 << 20
	// MaxRequestBytes is the read limit the app gives this service, above
	// MaxPayloadBytes so a batch a little too large is refused with its
	// field and reason rather than as an oversized body.
	MaxRequestBytes = MaxPayloadBytes + 4<<20
	maxLeaves       = 1000
	maxKeys         = 32
	maxDescription  = 1024
	defaultTTL      = 24 * time.Hour
	maxTTL          = 7 * 24 * time.Hour
)

// Deps are what the service needs from the rest of the control plane.
type Deps struct {
	// TrustDomain is the PKI's trust domain, bound into every approval.
	TrustDomain string
	// Notifier wakes a node's session when a leaf becomes its command.
	Notifier fleet.CommandNotifier
	// Signer signs each command a leaf becomes, as every command row is
	// signed (nil only where the app runs without a PKI).
	Signer fleet.CommandSigner
	// Machines resolves and runs power leaves (the bare-metal runtime);
	// without it a batch cannot name a machine.
	Machines Machines
}

// Machines is what machine leaves need from the bare-metal module: whether
// a machine is the tenant's and at its site, and starting the leaf's kind
// (a power action, a BMC password rotation) as the machine's workflow in
// the batch's transaction. *metal.Runtime implements it.
type Machines interface {
	ResolveMachine(ctx context.Context, q store.Querier, tenantID, siteID, machineID string) (bool, error)
	MachineLeafTx(ctx context.Context, tx *envelope.Tx, tenantID, machineID, kind string) (workflowID string, err error)
}

// Id prefixes of a machine subject's parts (the metal module's).
const (
	siteIDPrefix    = "site"
	machineIDPrefix = "mch"
)

// machineSubject splits "site/<site id>/machine/<machine id>".
func machineSubject(s string) (siteID, machineID string, ok bool) {
	parts := strings.Split(s, "/")
	if len(parts) != 4 || parts[0] != "site" || parts[2] != "machine" ||
		!envelope.IsID(parts[1], siteIDPrefix) || !envelope.IsID(parts[3], machineIDPrefix) {
		return "", "", false
	}
	return parts[1], parts[3], true
}

func errNotWired(what string) error {
	return &envelope.Error{Code: envelope.CodeInternal, Message: "internal error", Err: errors.New("quorum: no " + what + " wired")}
}

// Service serves the CommandBatchService API.
type Service struct {
	env  *envelope.Envelope
	deps Deps
}

// NewService returns the batch handlers.
func NewService(env *envelope.Envelope, deps Deps) *Service {
	return &Service{env: env, deps: deps}
}

var _ apiv1connect.CommandBatchServiceHandler = (*Service)(nil)

// BatchResource projects a batch into the authorization model.
func BatchResource(b Batch) iam.Resource {
	return iam.Resource{Type: "CommandBatch", ID: b.ID, TenantID: b.TenantID, Attrs: map[string]any{"state": b.State}}
}

func setResource(tenantID string) iam.Resource {
	return iam.Resource{Type: "ApproverSet", ID: tenantID, TenantID: tenantID}
}

// leafSpec is a validated leaf of a create.
type leafSpec struct {
	kind, subject string
	params        []byte
	digest        [32]byte
}

// Create proposes a batch: its leaves are checked against the tenant's
// nodes, its root computed, and it waits for approvals.
func (s *Service) Create(ctx context.Context, req *connect.Request[apiv1.CreateCommandBatchRequest]) (*connect.Response[apiv1.CreateCommandBatchResponse], error) {
	msg := req.Msg
	var (
		leaves []leafSpec
		total  int
		tenant tenancy.Tenant
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateCommandBatchResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			vs.MaxLen("description", msg.GetDescription(), maxDescription)
			if ttl := msg.GetTtlSeconds(); ttl < 0 || ttl > int64(maxTTL/time.Second) {
				vs.Add("ttl_seconds", "must be between 1 and %d (0 means %d)", int64(maxTTL/time.Second), int64(defaultTTL/time.Second))
			}
			switch n := len(msg.GetLeaves()); {
			case n == 0:
				vs.Add("leaves", "is required: at least one command")
			case n > maxLeaves:
				vs.Add("leaves", "must be at most %d commands, got %d", maxLeaves, n)
			}
			for i, l := range msg.GetLeaves() {
				if i >= maxLeaves {
					break
				}
				field := fmt.Sprintf("leaves[%d]", i)
				d, ok := fleet.Destructive(l.GetKind())
				switch {
				case !ok:
					vs.Add(field+".kind", "must be a destructive kind (%s), got %q", strings.Join(destructiveNames(), ", "), trunc(l.GetKind()))
				case d.Subject == fleet.SubjectMachine:
					if _, _, ok := machineSubject(l.GetSubject()); !ok {
						vs.Add(field+".subject", "a %s leaf names a machine as site/<site id>/machine/<machine id>, got %q", d.Kind, trunc(l.GetSubject()))
					}
					if len(l.GetParams().GetFields()) > 0 {
						vs.Add(field+".params", "a %s leaf takes no params", d.Kind)
					}
				default:
					vs.ID(field+".subject", l.GetSubject(), fleet.NodeIDPrefix)
				}
				digest, canon, err := approval.ParamsDigest(l.GetParams().AsMap())
				switch {
				case err != nil:
					vs.Add(field+".params", "must encode as JSON: %v", err)
				case len(canon) > fleet.MaxCommandParamsBytes:
					vs.Add(field+".params", "must be at most %d bytes as JSON (one command), got %d", fleet.MaxCommandParamsBytes, len(canon))
				}
				total += len(canon)
				leaves = append(leaves, leafSpec{kind: l.GetKind(), subject: l.GetSubject(), params: canon, digest: digest})
			}
			if total > MaxPayloadBytes {
				vs.Add("leaves", "params must be at most %d bytes (8 MiB) per batch in total, got %d", MaxPayloadBytes, total)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			t, found, err := tenancy.LookupTenant(ctx, q, msg.GetTenant())
			if err != nil || !found {
				return iam.Resource{Type: "CommandBatch", ID: iam.DraftID}, err
			}
			tenant = t
			return iam.Resource{Type: "CommandBatch", ID: iam.DraftID, TenantID: t.ID, Attrs: map[string]any{"state": StatePending}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateCommandBatchResponse, error) {
			if tenant.ID == "" {
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			}
			now := tx.Now()
			id := envelope.NewID(BatchIDPrefix, now)
			rows := make([]Leaf, len(leaves))
			sigLeaves := make([]approval.Leaf, len(leaves))
			for i, l := range leaves {
				target, err := s.resolve(ctx, tx, tenant.ID, i, l.kind, l.subject)
				if err != nil {
					return nil, err
				}
				rows[i] = Leaf{BatchID: id, Index: i, Kind: l.kind, Subject: l.subject, TargetID: target, Params: string(l.params),
					ParamsSHA256: hex.EncodeToString(l.digest[:])}
				sigLeaves[i] = approval.Leaf{Kind: l.kind, Subject: l.subject, ParamsDigest: l.digest}
			}
			// After the leaves: a stranger's node id answers NOT_FOUND
			// whatever the tenant's approvers.
			set, err := ApproverSetCurrent(ctx, tx, tenant.ID)
			if errors.Is(err, store.ErrNotFound) {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
					"tenant %s has no approver set: a tenant admin sets one first (better-compute batches approvers set)", tenant.Name)
			}
			if err != nil {
				return nil, err
			}
			root, err := approval.Root(sigLeaves)
			if err != nil {
				return nil, err
			}
			ttl := cmp.Or(time.Duration(msg.GetTtlSeconds())*time.Second, defaultTTL)
			b := Batch{ID: id, TenantID: tenant.ID, State: StatePending, Root: approval.HexRoot(root), Epoch: set.Epoch,
				Threshold: set.Threshold, TrustDomain: s.deps.TrustDomain, Description: msg.GetDescription(), PayloadBytes: int64(total),
				CreatedBy: tx.Caller().Principal.ID, CreateTime: now, ExpireTime: now.Add(ttl), UpdateTime: now}
			if err := BatchInsert(ctx, tx, &b, rows); err != nil {
				return nil, err
			}
			tx.SetResource(b.ID, "")
			tx.Emit(envelope.Event{Type: "commandBatch.created", TenantID: b.TenantID, ResourceType: "CommandBatch", ResourceID: b.ID,
				Data: map[string]any{"root": b.Root, "leaves": len(rows), "epoch": b.Epoch, "threshold": b.Threshold}})
			return &apiv1.CreateCommandBatchResponse{Batch: batchProto(b, rows, nil, now)}, nil
		},
	})
}

// resolve finds a leaf's subject among the tenant's nodes or machines and
// returns its id. Another tenant's node or machine answers exactly as a
// missing one.
func (s *Service) resolve(ctx context.Context, q store.Querier, tenantID string, i int, kind, subject string) (string, error) {
	if d, _ := fleet.Destructive(kind); d.Subject == fleet.SubjectMachine {
		if s.deps.Machines == nil {
			return "", errNotWired("machine runtime")
		}
		siteID, machineID, _ := machineSubject(subject)
		found, err := s.deps.Machines.ResolveMachine(ctx, q, tenantID, siteID, machineID)
		if err != nil {
			return "", err
		}
		if !found {
			return "", envelope.NotFound("machine", subject)
		}
		return machineID, nil
	}
	n, err := fleet.NodeGet(ctx, q, tenantID, subject)
	if errors.Is(err, store.ErrNotFound) {
		return "", envelope.NotFound("node", subject)
	}
	if err != nil {
		return "", err
	}
	if err := runnable(n, kind); err != nil {
		return "", envelope.Errorf(envelope.CodeFailedPrecondition, "leaves[%d]: %v", i, err)
	}
	return n.ID, nil
}

// runnable refuses a leaf its node cannot take: a retired node, or a kind
// the node's mode does not run (a disk.wipe outside a ramdisk).
func runnable(n fleet.Node, kind string) error {
	if n.State == fleet.NodeRetired {
		return fmt.Errorf("node %s is retired: it takes no commands", n.ID)
	}
	if err := fleet.CheckKindForMode(n.Mode, kind); err != nil {
		return fmt.Errorf("node %s: %w", n.ID, err)
	}
	return nil
}

func destructiveNames() []string {
	out := make([]string, len(fleet.DestructiveKinds))
	for i, d := range fleet.DestructiveKinds {
		out[i] = d.Kind
	}
	return out
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// batchRef is a request's batch as read before the decision.
type batchRef struct {
	tenant tenancy.Tenant
	batch  Batch
	found  bool
}

func lookupBatch(ctx context.Context, q store.Querier, tenantRef, id string) (batchRef, error) {
	var r batchRef
	t, found, err := tenancy.LookupTenant(ctx, q, tenantRef)
	if err != nil || !found {
		return r, err
	}
	r.tenant = t
	r.batch, err = BatchGet(ctx, q, t.ID, id, "")
	if errors.Is(err, store.ErrNotFound) {
		return r, nil
	}
	r.found = err == nil
	return r, err
}

func (r batchRef) resource() iam.Resource {
	if !r.found {
		return iam.Resource{Type: "CommandBatch", ID: envelope.UnknownResourceID, TenantID: r.tenant.ID}
	}
	return BatchResource(r.batch)
}

func (r batchRef) notFound(tenantRef, id string) error {
	switch {
	case r.tenant.ID == "":
		return envelope.NotFound("tenant", tenantRef)
	case !r.found:
		return envelope.NotFound("command batch", id)
	}
	return nil
}

func validateBatchRef(vs *envelope.Violations, tenant, id string) {
	vs.Ref("tenant", tenant, "tnt")
	vs.ID("id", id, BatchIDPrefix)
}

// Get reads one batch with its leaves and approvals.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetCommandBatchRequest]) (*connect.Response[apiv1.GetCommandBatchResponse], error) {
	var vs envelope.Violations
	validateBatchRef(&vs, req.Msg.GetTenant(), req.Msg.GetId())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		r         batchRef
		leaves    []Leaf
		approvals []Approval
	)
	if err := s.env.Resolve(ctx, "command batch", func(ctx context.Context, q store.Querier) (err error) {
		if r, err = lookupBatch(ctx, q, req.Msg.GetTenant(), req.Msg.GetId()); err != nil || !r.found {
			return err
		}
		if leaves, err = LeavesOf(ctx, q, r.batch.ID); err != nil {
			return err
		}
		approvals, err = ApprovalsOf(ctx, q, r.batch.ID)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return nil, err
	}
	if err := r.notFound(req.Msg.GetTenant(), req.Msg.GetId()); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetCommandBatchResponse{Batch: batchProto(r.batch, leaves, approvals, s.env.Clock().Now())}), nil
}

var listStates = []string{StatePending, StateApproved, StateRan, StateCanceled, StateExpired}

// List lists a tenant's batches, without their leaves' params.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListCommandBatchesRequest]) (*connect.Response[apiv1.ListCommandBatchesResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	if st := msg.GetState(); st != "" && !slices.Contains(listStates, st) {
		vs.Add("state", "must be one of %s, got %q", strings.Join(listStates, ", "), trunc(st))
	}
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := msg.GetTenant() + "/" + msg.GetState()
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t     tenancy.Tenant
		found bool
	)
	if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		t, found, err = tenancy.LookupTenant(ctx, q, msg.GetTenant())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, tenancy.TenantResource(t)); err != nil {
		return nil, err
	}
	if !found {
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", msg.GetTenant()))
	}
	now := s.env.Clock().Now()
	// Expired is derived, so the stored states it can hide behind are read
	// and the derived state filtered here.
	var stored []string
	switch msg.GetState() {
	case "":
	case StateExpired, StatePending, StateApproved:
		stored = []string{StatePending, StateApproved}
	default:
		stored = []string{msg.GetState()}
	}
	limit := envelope.PageSize(msg.GetPageSize())
	out := &apiv1.ListCommandBatchesResponse{}
	var batches []Batch
	if err := s.env.Resolve(ctx, "command batches", func(ctx context.Context, q store.Querier) error {
		cursor := after
		for len(batches) <= limit {
			page, err := BatchList(ctx, q, &BatchListParams{TenantID: t.ID, States: stored, After: cursor, Limit: limit + 1})
			if err != nil {
				return err
			}
			for _, b := range page {
				if msg.GetState() == "" || b.StateAt(now) == msg.GetState() {
					batches = append(batches, b)
				}
			}
			if len(page) <= limit {
				return nil
			}
			cursor = page[len(page)-1].ID
		}
		return nil
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if len(batches) > limit {
		out.NextPageToken = envelope.EncodePageToken(batches[limit-1].ID, filter)
		batches = batches[:limit]
	}
	for _, b := range batches {
		out.Batches = append(out.Batches, batchProto(b, nil, nil, now))
	}
	return connect.NewResponse(out), nil
}

// Approve verifies one approver's signature over the batch and records it;
// the batch is approved once threshold distinct keys signed.
func (s *Service) Approve(ctx context.Context, req *connect.Request[apiv1.ApproveCommandBatchRequest]) (*connect.Response[apiv1.ApproveCommandBatchResponse], error) {
	msg := req.Msg
	var r batchRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.ApproveCommandBatchResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			validateBatchRef(&vs, msg.GetTenant(), msg.GetId())
			if _, err := approval.ParseRoot(msg.GetRoot()); err != nil {
				vs.Add("root", "%v", err)
			}
			if msg.GetApproval().GetKey() == "" {
				vs.Add("approval.key", "is required: the approver's public key or its SHA256: key id")
			}
			if len(msg.GetApproval().GetSignature()) == 0 {
				vs.Add("approval.signature", "is required")
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (res iam.Resource, err error) {
			r, err = lookupBatch(ctx, q, msg.GetTenant(), msg.GetId())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.ApproveCommandBatchResponse, error) {
			if err := r.notFound(msg.GetTenant(), msg.GetId()); err != nil {
				return nil, err
			}
			now := tx.Now()
			b, err := BatchGet(ctx, tx, r.tenant.ID, r.batch.ID, store.ForUpdate(tx))
			if err != nil {
				return nil, err
			}
			if st := b.StateAt(now); st != StatePending {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "batch %s is %s: it takes no more approvals", b.ID, st)
			}
			if msg.GetRoot() != b.Root {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
					"the approval signed root %s but batch %s has root %s: fetch the batch again and check its leaves", msg.GetRoot(), b.ID, b.Root)
			}
			set, err := epochSet(ctx, tx, b)
			if err != nil {
				return nil, err
			}
			key, err := setKey(set, msg.GetApproval().GetKey())
			if err != nil {
				return nil, err
			}
			root, _ := approval.ParseRoot(b.Root)
			if err := approval.Verify(key, approval.BatchMessage(b.TrustDomain, b.ID, root, b.Epoch), msg.GetApproval().GetSignature()); err != nil {
				return nil, envelope.Errorf(envelope.CodePermissionDenied, "the approval by key %s does not verify over batch %s (root %s, epoch %d): %v",
					approval.KeyID(key), b.ID, b.Root, b.Epoch, err)
			}
			ok, err := ApprovalInsert(ctx, tx, &Approval{BatchID: b.ID, KeyID: approval.KeyID(key),
				Signature: base64.StdEncoding.EncodeToString(msg.GetApproval().GetSignature()), ApprovedBy: tx.Caller().Principal.ID, CreateTime: now})
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "key %s already approved batch %s", approval.KeyID(key), b.ID)
			}
			approvals, err := ApprovalsOf(ctx, tx, b.ID)
			if err != nil {
				return nil, err
			}
			if len(approvals) >= b.Threshold {
				if err := BatchStateSet(ctx, tx, b.ID, StateApproved, now); err != nil {
					return nil, err
				}
				b.State = StateApproved
				tx.Emit(envelope.Event{Type: "commandBatch.approved", TenantID: b.TenantID, ResourceType: "CommandBatch", ResourceID: b.ID,
					Data: map[string]any{"approvals": len(approvals), "threshold": b.Threshold}})
			}
			tx.SetAuditDetail("key " + approval.KeyID(key))
			leaves, err := LeavesOf(ctx, tx, b.ID)
			if err != nil {
				return nil, err
			}
			return &apiv1.ApproveCommandBatchResponse{Batch: batchProto(b, leaves, approvals, now)}, nil
		},
	})
}

// epochSet reads the approver set a batch is approved under; a batch whose
// set was replaced since it was proposed can no longer be approved or run.
func epochSet(ctx context.Context, q store.Querier, b Batch) (ApproverSet, error) {
	cur, err := ApproverSetCurrent(ctx, q, b.TenantID)
	if err != nil {
		return cur, err
	}
	if cur.Epoch != b.Epoch {
		return cur, envelope.Errorf(envelope.CodeFailedPrecondition,
			"the tenant's approver set moved from epoch %d to %d since batch %s was proposed: propose it again", b.Epoch, cur.Epoch, b.ID)
	}
	return cur, nil
}

// setKey finds the key an approval names (a public key or its key id) in
// the set; a key outside it is refused.
func setKey(set ApproverSet, ref string) (ssh.PublicKey, error) {
	want := ref
	if !strings.HasPrefix(ref, "SHA256:") {
		k, err := approval.ParseKey(ref)
		if err != nil {
			return nil, envelope.Errorf(envelope.CodeInvalidArgument, "approval.key: %v", err)
		}
		want = approval.KeyID(k)
	}
	for _, line := range set.Keys {
		k, err := approval.ParseKey(line)
		if err != nil {
			return nil, fmt.Errorf("quorum: stored approver key of tenant %s: %w", set.TenantID, err)
		}
		if approval.KeyID(k) == want {
			return k, nil
		}
	}
	return nil, envelope.Errorf(envelope.CodePermissionDenied, "key %s is not an approver of this tenant at epoch %d", trunc(want), set.Epoch)
}

// Cancel cancels a batch that has not run.
func (s *Service) Cancel(ctx context.Context, req *connect.Request[apiv1.CancelCommandBatchRequest]) (*connect.Response[apiv1.CancelCommandBatchResponse], error) {
	msg := req.Msg
	var r batchRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CancelCommandBatchResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateBatchRef(&vs, msg.GetTenant(), msg.GetId())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (res iam.Resource, err error) {
			r, err = lookupBatch(ctx, q, msg.GetTenant(), msg.GetId())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CancelCommandBatchResponse, error) {
			if err := r.notFound(msg.GetTenant(), msg.GetId()); err != nil {
				return nil, err
			}
			now := tx.Now()
			b, err := BatchGet(ctx, tx, r.tenant.ID, r.batch.ID, store.ForUpdate(tx))
			if err != nil {
				return nil, err
			}
			if st := b.StateAt(now); st != StatePending && st != StateApproved {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "batch %s is already %s", b.ID, st)
			}
			if err := BatchStateSet(ctx, tx, b.ID, StateCanceled, now); err != nil {
				return nil, err
			}
			b.State = StateCanceled
			tx.Emit(envelope.Event{Type: "commandBatch.canceled", TenantID: b.TenantID, ResourceType: "CommandBatch", ResourceID: b.ID})
			return &apiv1.CancelCommandBatchResponse{Batch: batchProto(b, nil, nil, now)}, nil
		},
	})
}

// Run turns an approved batch's leaves into commands, each once: a second
// run answers the batch as it ran.
func (s *Service) Run(ctx context.Context, req *connect.Request[apiv1.RunCommandBatchRequest]) (*connect.Response[apiv1.RunCommandBatchResponse], error) {
	msg := req.Msg
	var r batchRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.RunCommandBatchResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			validateBatchRef(&vs, msg.GetTenant(), msg.GetId())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (res iam.Resource, err error) {
			r, err = lookupBatch(ctx, q, msg.GetTenant(), msg.GetId())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.RunCommandBatchResponse, error) {
			if err := r.notFound(msg.GetTenant(), msg.GetId()); err != nil {
				return nil, err
			}
			now := tx.Now()
			b, err := BatchGet(ctx, tx, r.tenant.ID, r.batch.ID, store.ForUpdate(tx))
			if err != nil {
				return nil, err
			}
			leaves, err := LeavesOf(ctx, tx, b.ID)
			if err != nil {
				return nil, err
			}
			approvals, err := ApprovalsOf(ctx, tx, b.ID)
			if err != nil {
				return nil, err
			}
			switch st := b.StateAt(now); st {
			case StateRan:
				return &apiv1.RunCommandBatchResponse{Batch: batchProto(b, leaves, approvals, now)}, nil
			case StatePending:
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
					"batch %s has %d of the %d approvals it needs: it runs only once a quorum of approver keys signed its root", b.ID, len(approvals), b.Threshold)
			case StateApproved:
			default:
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "batch %s is %s: it cannot run", b.ID, st)
			}
			set, err := epochSet(ctx, tx, b)
			if err != nil {
				return nil, err
			}
			// The rows are not trusted to say what was approved: the root is
			// recomputed from the stored leaves and every approval checked
			// again, so an edited leaf or approval row runs nothing.
			if err := verifyStored(set, b, leaves, approvals); err != nil {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "batch %s does not verify: %v", b.ID, err)
			}
			for i, l := range leaves {
				if l.CommandID != "" || l.WorkflowID != "" {
					continue
				}
				if d, _ := fleet.Destructive(l.Kind); d.Subject == fleet.SubjectMachine {
					if s.deps.Machines == nil {
						return nil, errNotWired("machine runtime")
					}
					// The machine's workflow sends the site agent its BMC
					// call, a command row of the fleet's, at most once.
					wf, err := s.deps.Machines.MachineLeafTx(ctx, tx, b.TenantID, l.TargetID, l.Kind)
					var apiErr *envelope.Error
					if errors.As(err, &apiErr) && apiErr.Code != envelope.CodeInternal {
						return nil, envelope.Errorf(apiErr.Code, "leaves[%d]: %s", i, apiErr.Message)
					}
					if err != nil {
						return nil, err
					}
					if err := LeafRanSet(ctx, tx, b.ID, l.Index, "", wf); err != nil {
						return nil, err
					}
					leaves[i].WorkflowID = wf
					continue
				}
				n, err := fleet.NodeGet(ctx, tx, b.TenantID, l.TargetID)
				if errors.Is(err, store.ErrNotFound) {
					return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "leaves[%d]: node %s is gone", i, l.Subject)
				}
				if err != nil {
					return nil, err
				}
				if err := runnable(n, l.Kind); err != nil {
					return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "leaves[%d]: %v", i, err)
				}
				var params map[string]any
				if err := json.Unmarshal([]byte(l.Params), &params); err != nil {
					return nil, err
				}
				id, err := fleet.SendSystemCommand(ctx, tx.Tx, s.deps.Notifier, fleet.SystemCommand{
					TenantID: b.TenantID, NodeID: n.ID, Kind: l.Kind, Params: params,
					// One command per leaf, whoever runs the batch and however often.
					IdempotencyKey: fmt.Sprintf("batch:%s:%d", b.ID, l.Index),
					CreatedBy:      tx.Caller().Principal.ID, Time: now, Signer: s.deps.Signer,
				})
				if err != nil {
					return nil, err
				}
				if err := LeafRanSet(ctx, tx, b.ID, l.Index, id, ""); err != nil {
					return nil, err
				}
				leaves[i].CommandID = id
				tx.Emit(envelope.Event{Type: "command.created", TenantID: b.TenantID, ResourceType: "Command", ResourceID: id,
					Data: map[string]any{"node_id": n.ID, "kind": l.Kind, "batch_id": b.ID}})
			}
			if err := BatchStateSet(ctx, tx, b.ID, StateRan, now); err != nil {
				return nil, err
			}
			b.State = StateRan
			tx.Emit(envelope.Event{Type: "commandBatch.ran", TenantID: b.TenantID, ResourceType: "CommandBatch", ResourceID: b.ID,
				Data: map[string]any{"commands": len(leaves)}})
			return &apiv1.RunCommandBatchResponse{Batch: batchProto(b, leaves, approvals, now)}, nil
		},
	})
}

// verifyStored checks a batch from its rows alone: its root from its
// leaves, and a quorum of valid approvals by distinct keys of its set.
func verifyStored(set ApproverSet, b Batch, leaves []Leaf, approvals []Approval) error {
	sl := make([]approval.Leaf, len(leaves))
	for i, l := range leaves {
		var params map[string]any
		if err := json.Unmarshal([]byte(l.Params), &params); err != nil {
			return fmt.Errorf("leaf %d params: %w", i, err)
		}
		d, _, err := approval.ParamsDigest(params)
		if err != nil {
			return err
		}
		if hex.EncodeToString(d[:]) != l.ParamsSHA256 {
			return fmt.Errorf("leaf %d: params do not match their digest", i)
		}
		sl[i] = approval.Leaf{Kind: l.Kind, Subject: l.Subject, ParamsDigest: d}
	}
	root, err := approval.Root(sl)
	if err != nil {
		return err
	}
	if approval.HexRoot(root) != b.Root {
		return errors.New("its leaves do not hash to its root")
	}
	msg := approval.BatchMessage(b.TrustDomain, b.ID, root, b.Epoch)
	// Counted by the key itself, not the row's reference: one key stored
	// twice (by fingerprint and by its text) is one approval.
	valid, seen := 0, map[string]bool{}
	for _, a := range approvals {
		key, err := setKey(set, a.KeyID)
		if err != nil {
			continue
		}
		id := approval.KeyID(key)
		sig, err := base64.StdEncoding.DecodeString(a.Signature)
		if err == nil && !seen[id] && approval.Verify(key, msg, sig) == nil {
			seen[id] = true
			valid++
		}
	}
	if valid < set.Threshold {
		return fmt.Errorf("%d valid approvals, %d needed", valid, set.Threshold)
	}
	return nil
}

// PutApproverSet sets a tenant's approvers. The first set needs only the
// decision (tenant admins); every later one needs approvals by a quorum of
// the set it replaces over the new set's canonical bytes, and a refusal is
// audited.
func (s *Service) PutApproverSet(ctx context.Context, req *connect.Request[apiv1.PutApproverSetRequest]) (*connect.Response[apiv1.PutApproverSetResponse], error) {
	msg := req.Msg
	var (
		tenant tenancy.Tenant
		keys   []ssh.PublicKey
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.PutApproverSetResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			seen := map[string]int{}
			switch n := len(msg.GetPublicKeys()); {
			case n == 0:
				vs.Add("public_keys", "is required: at least one approver key")
			case n > maxKeys:
				vs.Add("public_keys", "must be at most %d keys, got %d", maxKeys, n)
			}
			for i, line := range msg.GetPublicKeys() {
				k, err := approval.ParseKey(line)
				if err != nil {
					vs.Add(fmt.Sprintf("public_keys[%d]", i), "%v", err)
					continue
				}
				if j, dup := seen[approval.KeyID(k)]; dup {
					vs.Add(fmt.Sprintf("public_keys[%d]", i), "is the same key as public_keys[%d]", j)
					continue
				}
				seen[approval.KeyID(k)] = i
				keys = append(keys, k)
			}
			if t := msg.GetThreshold(); t < 1 || int(t) > len(msg.GetPublicKeys()) {
				vs.Add("threshold", "must be between 1 and the number of keys (%d), got %d", len(msg.GetPublicKeys()), t)
			}
			if msg.GetPreviousEpoch() < 0 {
				vs.Add("previous_epoch", "must not be negative")
			}
			for i, a := range msg.GetApprovals() {
				if a.GetKey() == "" || len(a.GetSignature()) == 0 {
					vs.Add(fmt.Sprintf("approvals[%d]", i), "needs a key and a signature")
				}
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			t, found, err := tenancy.LookupTenant(ctx, q, msg.GetTenant())
			if err != nil || !found {
				return iam.Resource{Type: "ApproverSet", ID: iam.DraftID}, err
			}
			tenant = t
			return setResource(t.ID), nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.PutApproverSetResponse, error) {
			if tenant.ID == "" {
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			}
			now := tx.Now()
			prev, err := ApproverSetCurrent(ctx, tx, tenant.ID)
			first := errors.Is(err, store.ErrNotFound)
			if err != nil && !first {
				return nil, err
			}
			if msg.GetPreviousEpoch() != prev.Epoch {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
					"tenant %s's approver set is at epoch %d, not %d: sign the change against the current set", tenant.Name, prev.Epoch, msg.GetPreviousEpoch())
			}
			epoch := prev.Epoch + 1
			canon := approval.SetMessage(s.deps.TrustDomain, tenant.ID, epoch, int(msg.GetThreshold()), keys)
			var approvals []SetApproval
			if first {
				if len(msg.GetApprovals()) > 0 {
					return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "tenant %s has no approver set yet: the first set carries no approvals", tenant.Name)
				}
			} else if approvals, err = quorumOver(prev, canon, msg.GetApprovals()); err != nil {
				return nil, envelope.Errorf(envelope.CodePermissionDenied,
					"changing tenant %s's approver set needs approvals by %d of the %d keys of epoch %d over the new set's canonical bytes: %v",
					tenant.Name, prev.Threshold, len(prev.Keys), prev.Epoch, err)
			}
			lines := make([]string, len(keys))
			for i, k := range keys {
				lines[i] = approval.AuthorizedKey(k)
			}
			slices.Sort(lines)
			set := ApproverSet{TenantID: tenant.ID, Epoch: epoch, Threshold: int(msg.GetThreshold()), Keys: lines,
				Digest: digestHex(canon), Approvals: approvals, CreatedBy: tx.Caller().Principal.ID, CreateTime: now}
			if err := ApproverSetInsert(ctx, tx, &set); errors.Is(err, ErrEpochTaken) {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "tenant %s's approver set changed concurrently: read it again", tenant.Name)
			} else if err != nil {
				return nil, err
			}
			tx.SetResource(tenant.ID, "")
			tx.SetAuditDetail(fmt.Sprintf("epoch %d, %d of %d", epoch, set.Threshold, len(lines)))
			tx.Emit(envelope.Event{Type: "approverSet.changed", TenantID: tenant.ID, ResourceType: "ApproverSet", ResourceID: tenant.ID,
				Data: map[string]any{"epoch": epoch, "threshold": set.Threshold, "keys": len(lines)}})
			return &apiv1.PutApproverSetResponse{ApproverSet: setProto(set, s.deps.TrustDomain)}, nil
		},
	})
}

// quorumOver checks that distinct keys of prev, at least its threshold,
// signed msg; it says why each approval that did not count failed.
func quorumOver(prev ApproverSet, msg []byte, sigs []*apiv1.KeySignature) ([]SetApproval, error) {
	var (
		ok      []SetApproval
		reasons []string
		seen    = map[string]bool{}
	)
	for i, a := range sigs {
		key, err := setKey(prev, a.GetKey())
		if err != nil {
			reasons = append(reasons, fmt.Sprintf("approvals[%d]: %v", i, envelope.AsError(err).Message))
			continue
		}
		id := approval.KeyID(key)
		if seen[id] {
			reasons = append(reasons, fmt.Sprintf("approvals[%d]: key %s counted already", i, id))
			continue
		}
		if err := approval.Verify(key, msg, a.GetSignature()); err != nil {
			reasons = append(reasons, fmt.Sprintf("approvals[%d]: key %s: %v", i, id, err))
			continue
		}
		seen[id] = true
		ok = append(ok, SetApproval{KeyID: id, Signature: a.GetSignature()})
	}
	if len(ok) < prev.Threshold {
		why := fmt.Sprintf("got %d valid", len(ok))
		if len(reasons) > 0 {
			why += " (" + strings.Join(reasons, "; ") + ")"
		}
		return nil, errors.New(why)
	}
	return ok, nil
}

// GetApproverSet reads a tenant's current approver set.
func (s *Service) GetApproverSet(ctx context.Context, req *connect.Request[apiv1.GetApproverSetRequest]) (*connect.Response[apiv1.GetApproverSetResponse], error) {
	var vs envelope.Violations
	vs.Ref("tenant", req.Msg.GetTenant(), "tnt")
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t     tenancy.Tenant
		found bool
		set   ApproverSet
		has   bool
	)
	if err := s.env.Resolve(ctx, "approver set", func(ctx context.Context, q store.Querier) (err error) {
		if t, found, err = tenancy.LookupTenant(ctx, q, req.Msg.GetTenant()); err != nil || !found {
			return err
		}
		set, err = ApproverSetCurrent(ctx, q, t.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		has = err == nil
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	res := setResource(t.ID)
	if !found {
		res = tenancy.TenantResource(t)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	switch {
	case !found:
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", req.Msg.GetTenant()))
	case !has:
		return nil, s.env.Fail(ctx, envelope.NotFound("approver set", req.Msg.GetTenant()))
	}
	return connect.NewResponse(&apiv1.GetApproverSetResponse{ApproverSet: setProto(set, s.deps.TrustDomain)}), nil
}
