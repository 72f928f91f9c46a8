package metal

import (
	"context"
	"errors"
	"slices"
	"strings"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// BindingMachine is a lease's binding: the whole machine is bound to the
// lessee. (Not "node": a reservation's binding node means bcd binds an
// allocation into cgroups on a shared node.)
const BindingMachine = "machine"

// LeaseResource projects a lease into the authorization model, in the
// tenant that asks: its lessee, or the machine's owner. Any other tenant
// never finds it.
func LeaseResource(l Lease, tenantID string) iam.Resource {
	return iam.Resource{Type: "MachineLease", ID: l.ID, TenantID: tenantID,
		Attrs: map[string]any{"machine": l.MachineID, "state": l.State}}
}

// leaseRef is a lease resolved in the caller's named scope.
type leaseRef struct {
	scope
	name  string
	obj   Lease
	found bool
}

func lookupLease(ctx context.Context, q store.Querier, tenantRef, id string) (leaseRef, error) {
	r := leaseRef{name: id}
	var err error
	if r.scope, err = tenancy.LookupScope(ctx, q, tenantRef); err != nil || !r.Found || r.Platform {
		return r, err
	}
	r.obj, err = LeaseGetVisible(ctx, q, r.ID(), id, "")
	if errors.Is(err, store.ErrNotFound) {
		return r, nil
	}
	r.found = err == nil
	return r, err
}

func (r leaseRef) resource() iam.Resource {
	if !r.found {
		return r.Missing("MachineLease")
	}
	return LeaseResource(r.obj, r.ID())
}

func (r leaseRef) notFound() error {
	if err := r.NotFound(); err != nil {
		return err
	}
	if !r.found {
		return envelope.NotFound("lease", r.name)
	}
	return nil
}

// lock reads the lease again under its row lock.
func (r leaseRef) lock(ctx context.Context, tx *envelope.Tx) (Lease, error) {
	l, err := LeaseGetVisible(ctx, tx, r.ID(), r.obj.ID, store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) {
		return l, envelope.NotFound("lease", r.name)
	}
	return l, err
}

// LeaseProto is the API's view of a lease and its evidence.
func LeaseProto(l Lease, ev []Evidence) *apiv1.MachineLease {
	out := &apiv1.MachineLease{Id: l.ID, MachineId: l.MachineID, OwnerTenantId: l.OwnerTenantID, LesseeTenantId: l.LesseeTenantID,
		Binding: BindingMachine, State: l.State, ImageId: l.ImageID, ImageName: l.ImageName, ImageSha256: l.ImageSHA256,
		SshKeyFingerprint: l.SSHKeyFingerprint, Reason: l.Reason, CreatedBy: l.CreatedBy, ReleasedBy: l.ReleasedBy,
		CreateTime: ts(&l.CreateTime), ReleaseTime: ts(l.ReleaseTime), EndTime: ts(l.EndTime)}
	for _, e := range ev {
		out.Evidence = append(out.Evidence, &apiv1.MachineLeaseEvidence{Step: e.Step, Kind: e.Kind, WorkflowId: e.WorkflowID,
			Verified: e.Verified, Digest: e.Digest, Signer: e.Signer, Detail: e.Detail, Time: ts(&e.CreateTime)})
	}
	return out
}

// Lease offers a ready machine to a lessee tenant.
func (s *MachineService) Lease(ctx context.Context, req *connect.Request[apiv1.LeaseMachineRequest]) (*connect.Response[apiv1.LeaseMachineResponse], error) {
	msg := req.Msg
	var r machineRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.LeaseMachineResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("machine", msg.GetMachine(), MachineIDPrefix)
			if msg.GetLessee() == "" {
				vs.Add("lessee", "is required: the tenant the machine is lent to")
			} else {
				vs.Ref("lessee", msg.GetLessee(), "tnt")
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupMachine(ctx, q, msg.GetTenant(), msg.GetMachine())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.LeaseMachineResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			lessee, found, err := tenancy.LookupTenant(ctx, tx, msg.GetLessee())
			if err != nil {
				return nil, err
			}
			if !found {
				return nil, &envelope.Error{Code: envelope.CodeNotFound, Message: "tenant " + truncate(msg.GetLessee()) + " not found",
					Violations: []envelope.Violation{{Field: "lessee", Reason: "no such tenant"}}}
			}
			m, err := lockMachine(ctx, tx, r)
			if err != nil {
				return nil, err
			}
			l, err := s.rt.OfferTx(ctx, tx, &m, lessee.ID, tx.Caller().Principal.ID)
			if err != nil {
				return nil, err
			}
			tx.SetResource(l.ID, m.TenantID)
			return &apiv1.LeaseMachineResponse{Lease: LeaseProto(l, nil)}, nil
		},
	})
}

// AcceptLease deploys an offered lease's machine with the lessee's image
// and root key.
func (s *MachineService) AcceptLease(ctx context.Context, req *connect.Request[apiv1.AcceptMachineLeaseRequest]) (*connect.Response[apiv1.AcceptMachineLeaseResponse], error) {
	msg := req.Msg
	var r leaseRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.AcceptMachineLeaseResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("lease", msg.GetLease(), LeaseIDPrefix)
			if msg.GetImage() == "" {
				vs.Add("image", "is required: the lessee's signed raw or qcow2 image")
			} else {
				vs.MaxLen("image", msg.GetImage(), 200)
			}
			switch k := msg.GetSshKey(); {
			case k == "":
				vs.Add("ssh_key", "is required: root's OpenSSH public key line")
			case len(k) > maxSSHKey:
				vs.Add("ssh_key", "must be at most %d bytes", maxSSHKey)
			default:
				if err := checkSSHKey(strings.TrimSpace(k)); err != nil {
					vs.Add("ssh_key", "must be an OpenSSH public key line (ssh-ed25519 AAAA…): %v", err)
				}
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupLease(ctx, q, msg.GetTenant(), msg.GetLease())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.AcceptMachineLeaseResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			l, err := r.lock(ctx, tx)
			if err != nil {
				return nil, err
			}
			if l.LesseeTenantID != r.ID() {
				return nil, &envelope.Error{Code: envelope.CodeFailedPrecondition,
					Message:    "lease " + l.ID + " is accepted by its lessee, not by the machine's owner",
					Violations: []envelope.Violation{{Field: "tenant", Reason: "not the lease's lessee"}}}
			}
			if err := s.rt.AcceptTx(ctx, tx, &l, msg.GetImage(), strings.TrimSpace(msg.GetSshKey()), tx.Caller().Principal.ID); err != nil {
				return nil, err
			}
			tx.SetResource(l.ID, l.LesseeTenantID)
			return &apiv1.AcceptMachineLeaseResponse{Lease: LeaseProto(l, nil)}, nil
		},
	})
}

// ReleaseLease starts a lease's teardown (or withdraws an offer nobody
// accepted yet).
func (s *MachineService) ReleaseLease(ctx context.Context, req *connect.Request[apiv1.ReleaseMachineLeaseRequest]) (*connect.Response[apiv1.ReleaseMachineLeaseResponse], error) {
	msg := req.Msg
	var r leaseRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.ReleaseMachineLeaseResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("lease", msg.GetLease(), LeaseIDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupLease(ctx, q, msg.GetTenant(), msg.GetLease())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.ReleaseMachineLeaseResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			l, err := r.lock(ctx, tx)
			if err != nil {
				return nil, err
			}
			if err := s.rt.ReleaseLeaseTx(ctx, tx, &l, tx.Caller().Principal.ID); err != nil {
				return nil, err
			}
			tx.SetResource(l.ID, r.ID())
			return &apiv1.ReleaseMachineLeaseResponse{Lease: LeaseProto(l, nil)}, nil
		},
	})
}

// GetLease reads a lease and its teardown evidence.
func (s *MachineService) GetLease(ctx context.Context, req *connect.Request[apiv1.GetMachineLeaseRequest]) (*connect.Response[apiv1.GetMachineLeaseResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	vs.Ref("lease", msg.GetLease(), LeaseIDPrefix)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		r  leaseRef
		ev []Evidence
	)
	if err := s.env.Resolve(ctx, "lease", func(ctx context.Context, q store.Querier) (err error) {
		if r, err = lookupLease(ctx, q, msg.GetTenant(), msg.GetLease()); err != nil || !r.found {
			return err
		}
		if ev, err = EvidenceList(ctx, q, r.obj.ID); err != nil {
			return err
		}
		// In the teardown's order.
		slices.SortStableFunc(ev, func(a, b Evidence) int {
			return slices.Index(TeardownSteps, a.Step) - slices.Index(TeardownSteps, b.Step)
		})
		return nil
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return nil, err
	}
	if err := r.notFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetMachineLeaseResponse{Lease: LeaseProto(r.obj, ev)}), nil
}
