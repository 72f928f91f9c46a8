package vps

import (
	"context"
	"errors"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// ProviderInstances runs the instances of provider pools (package
// providerpools): each is a server rented through the pool's provider
// account. Every method runs in the caller's transaction and only records
// and queues: the provider is called by a job, outside any transaction.
type ProviderInstances interface {
	// CreateTx records the provider side of a new instance, whose row the
	// caller has just written, and queues the create.
	CreateTx(ctx context.Context, tx store.Tx, in *Instance, p pool.Pool, policy *apiv1.ProviderPolicy) error
	// Owns reports whether an instance is a provider pool's.
	Owns(ctx context.Context, q store.Querier, instanceID string) (bool, error)
	// DeleteTx queues the delete of the instance's server; the instance
	// turns deleted once the provider confirmed.
	DeleteTx(ctx context.Context, tx store.Tx, in *Instance) error
	// PowerTx queues a power action (on, off, reboot) on its server.
	PowerTx(ctx context.Context, tx store.Tx, in *Instance, action string) error
}

// SetProviders wires the provider pools' instances (nil: a create on a
// provider pool is refused).
func (s *InstanceService) SetProviders(p ProviderInstances) { s.providers = p }

// createOnProvider records an instance of a provider pool: the row, and
// the provider's side, in the create's transaction; a job makes the server.
func (s *InstanceService) createOnProvider(ctx context.Context, tx bootTx, msg *apiv1.CreateInstanceRequest, t *createTarget,
	policy *apiv1.ProviderPolicy) (Instance, error) {
	if err := t.scope.NotFound(); err != nil {
		return Instance{}, err
	}
	if t.scope.Platform {
		return Instance{}, envelope.Invalid(envelope.Violation{Field: "tenant", Reason: "instances belong to a tenant: name one"})
	}
	if msg.GetProject() != "" && !t.projOK {
		return Instance{}, envelope.NotFound("project", msg.GetProject())
	}
	// What a provider's server does not take, named field by field.
	var vs envelope.Violations
	if msg.GetFlavor() != "" {
		vs.Add("flavor", "pool %s rents servers of type %s: give no flavor", t.pool.Name, policy.GetServerType())
	}
	if msg.GetIpPool() != "" {
		vs.Add("ip_pool", "a provider pool's servers take the provider's addresses: give no IP pool")
	}
	if len(msg.GetVolumes()) > 0 {
		vs.Add("volumes", "a provider pool's servers have the disk of their server type: give no volumes")
	}
	if msg.GetNetworkPolicy() != "" {
		vs.Add("network_policy", "a provider's server is on the provider's network: give no network policy")
	}
	if msg.GetUserData() != "" {
		vs.Add("user_data", "a provider pool's server boots the control plane's cloud-init (its join): give no user data")
	}
	if err := vs.Err(); err != nil {
		return Instance{}, err
	}
	if s.providers == nil {
		return Instance{}, envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s is a provider pool, and this control plane runs no provider pools", t.pool.Name)
	}
	project := t.project
	if !t.projOK {
		p, err := tenancy.ProjectGet(ctx, tx, t.scope.ID(), "default")
		switch {
		case err == nil:
			project = p
		case !errors.Is(err, store.ErrNotFound):
			return Instance{}, err
		default:
			ps, err := tenancy.ProjectList(ctx, tx, t.scope.ID(), "", "", 2)
			if err != nil {
				return Instance{}, err
			}
			switch len(ps) {
			case 0:
				return Instance{}, envelope.Errorf(envelope.CodeFailedPrecondition, "tenant has no project to create the instance in: create one")
			case 2:
				return Instance{}, envelope.Invalid(envelope.Violation{Field: "project", Reason: "the tenant has no project named default: name one"})
			}
			project = ps[0]
		}
	}
	if _, err := InstanceGet(ctx, tx, t.scope.ID(), msg.GetName(), ""); err == nil {
		return Instance{}, envelope.Errorf(envelope.CodeAlreadyExists, "an instance named %q already exists in %s", msg.GetName(), t.scope.Name())
	} else if !errors.Is(err, store.ErrNotFound) {
		return Instance{}, err
	}
	now := tx.now
	in := Instance{ID: envelope.NewID(InstanceIDPrefix, now), TenantID: t.scope.ID(), ProjectID: project.ID, Name: msg.GetName(),
		State: StatePending, FlavorName: policy.GetServerType(), Image: msg.GetImage(), SSHKeys: msg.GetSshKeys(),
		PoolID: t.pool.ID, CreatedBy: tx.by, CreateTime: now, UpdateTime: now}
	if in.Image == "" {
		in.Image = policy.GetImage()
	}
	if err := InstanceInsert(ctx, tx, &in); err != nil {
		if errors.Is(err, store.ErrUnique) {
			return Instance{}, envelope.Errorf(envelope.CodeAlreadyExists, "an instance named %q already exists in %s", in.Name, t.scope.Name())
		}
		return Instance{}, err
	}
	if err := s.providers.CreateTx(ctx, tx, &in, t.pool, policy); err != nil {
		return Instance{}, err
	}
	tx.emit(instanceEvent("instance.created", &in, map[string]any{"server_type": policy.GetServerType(), "pool_id": in.PoolID}))
	return in, nil
}

// onProvider reports whether an instance is a provider pool's.
func (s *InstanceService) onProvider(ctx context.Context, q store.Querier, in *Instance) (bool, error) {
	if s.providers == nil || in.ReservationID != "" {
		return false, nil
	}
	return s.providers.Owns(ctx, q, in.ID)
}
