package vps

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Flavor limits: beyond any host this control plane places on.
const (
	MaxVCPUs          = 1024
	MaxMemoryMiB      = 16 << 20 // 16 TiB
	MaxDiskGiB        = 64 << 10 // 64 TiB
	MaxGPUs           = 64
	maxGPUModel       = 64
	maxDescriptionLen = 1024
	// hugepageMiB is the hugepage size guests are backed with (2 MiB).
	hugepageMiB = 2
)

// FlavorService serves the FlavorService API.
type FlavorService struct {
	env *envelope.Envelope
}

// NewFlavorService returns the flavor handlers.
func NewFlavorService(env *envelope.Envelope) *FlavorService { return &FlavorService{env: env} }

var _ apiv1connect.FlavorServiceHandler = (*FlavorService)(nil)

// FlavorResource projects a flavor into the authorization model.
func FlavorResource(f Flavor) iam.Resource {
	return iam.Resource{Type: "Flavor", ID: f.ID, TenantID: f.TenantID, Attrs: map[string]any{"name": f.Name,
		"vcpus": int64(f.VCPUs), "gpus": int64(f.GPUs)}}
}

type flavorRef = ref[Flavor]

func lookupFlavor(ctx context.Context, q store.Querier, tenantRef, name string, platform bool) (flavorRef, error) {
	return lookupRef(ctx, q, tenantRef, name, "flavor", "Flavor", platform,
		func(ctx context.Context, q store.Querier, owner, name string) (Flavor, error) {
			return FlavorGet(ctx, q, owner, name, "")
		}, FlavorResource)
}

// validateFlavor checks a flavor's sizes and placement flags.
func validateFlavor(vs *envelope.Violations, msg *apiv1.CreateFlavorRequest) {
	if n := msg.GetVcpus(); n < 1 || n > MaxVCPUs {
		vs.Add("vcpus", "must be between 1 and %d, got %d", MaxVCPUs, n)
	}
	if n := msg.GetMemoryMib(); n < 128 || n > MaxMemoryMiB {
		vs.Add("memory_mib", "must be between 128 and %d MiB, got %d", MaxMemoryMiB, n)
	} else if msg.GetHugepages() && n%hugepageMiB != 0 {
		vs.Add("memory_mib", "must be a multiple of %d MiB (the hugepage size) when hugepages is set, got %d", hugepageMiB, n)
	}
	if n := msg.GetDiskGib(); n < 1 || n > MaxDiskGiB {
		vs.Add("disk_gib", "must be between 1 and %d GiB, got %d", MaxDiskGiB, n)
	}
	if n := msg.GetGpus(); n < 0 || n > MaxGPUs {
		vs.Add("gpus", "must be between 0 and %d, got %d", MaxGPUs, n)
	}
	vs.MaxLen("gpu_model", msg.GetGpuModel(), maxGPUModel)
	if msg.GetGpuModel() != "" && msg.GetGpus() == 0 {
		vs.Add("gpu_model", "is set on a flavor without GPUs: set gpus too")
	}
	vs.MaxLen("description", msg.GetDescription(), maxDescriptionLen)
	if msg.GetBalloon() {
		// A balloon returns guest pages to the host; hugepages and a
		// passthrough GPU's DMA (VFIO) pin them, so nothing would return.
		switch {
		case msg.GetHugepages():
			vs.Add("balloon", "hugepage-backed memory cannot be ballooned: unset hugepages or balloon")
		case msg.GetGpus() > 0:
			vs.Add("balloon", "a flavor with GPUs cannot balloon: GPU passthrough pins the guest's memory")
		}
	}
	if n := msg.GetMinMemoryMib(); n != 0 {
		switch {
		case !msg.GetBalloon():
			vs.Add("min_memory_mib", "is set on a flavor without balloon: set balloon too")
		case n < 128 || n > msg.GetMemoryMib():
			vs.Add("min_memory_mib", "must be between 128 MiB and memory_mib (%d), got %d", msg.GetMemoryMib(), n)
		}
	}
}

// Create adds a flavor to the scope (the platform's flavors every tenant
// sees).
func (s *FlavorService) Create(ctx context.Context, req *connect.Request[apiv1.CreateFlavorRequest]) (*connect.Response[apiv1.CreateFlavorResponse], error) {
	msg := req.Msg
	var sc scope
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateFlavorResponse]{
		// A refusal past the decision (a name taken, a pool with leases)
		// stays on record.
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Name("name", msg.GetName())
			validateFlavor(&vs, msg)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant()); err != nil || !sc.Found {
				return iam.Resource{Type: "Flavor", ID: iam.DraftID}, err
			}
			return iam.Resource{Type: "Flavor", ID: iam.DraftID, TenantID: sc.ID(), Attrs: map[string]any{"name": msg.GetName(),
				"vcpus": int64(msg.GetVcpus()), "gpus": int64(msg.GetGpus())}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateFlavorResponse, error) {
			if err := sc.NotFound(); err != nil {
				return nil, err
			}
			now := tx.Now()
			f := Flavor{ID: envelope.NewID(FlavorIDPrefix, now), TenantID: sc.ID(), Name: msg.GetName(), VCPUs: msg.GetVcpus(),
				MemoryMiB: msg.GetMemoryMib(), DiskGiB: msg.GetDiskGib(), GPUs: msg.GetGpus(), GPUModel: msg.GetGpuModel(),
				NUMAAffine: msg.GetNumaAffine(), Pinned: msg.GetPinned(), Hugepages: msg.GetHugepages(),
				Description: msg.GetDescription(), CreateTime: now, Balloon: msg.GetBalloon(), MinMemoryMiB: msg.GetMinMemoryMib()}
			if err := FlavorInsert(ctx, tx, &f); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "a flavor named %q already exists in %s", f.Name, sc.Name())
				}
				return nil, err
			}
			tx.SetResource(f.ID, "")
			tx.Emit(envelope.Event{Type: "flavor.created", TenantID: f.TenantID, ResourceType: "Flavor", ResourceID: f.ID,
				Data: map[string]any{"name": f.Name, "vcpus": f.VCPUs, "memory_mib": f.MemoryMiB, "disk_gib": f.DiskGiB, "gpus": f.GPUs}})
			return &apiv1.CreateFlavorResponse{Flavor: FlavorProto(f)}, nil
		},
	})
}

// Get reads a flavor of the scope or of the platform.
func (s *FlavorService) Get(ctx context.Context, req *connect.Request[apiv1.GetFlavorRequest]) (*connect.Response[apiv1.GetFlavorResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	vs.Ref("flavor", msg.GetFlavor(), FlavorIDPrefix)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var r flavorRef
	if err := s.env.Resolve(ctx, "flavor", func(ctx context.Context, q store.Querier) (err error) {
		r, err = lookupFlavor(ctx, q, msg.GetTenant(), msg.GetFlavor(), true)
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
	return connect.NewResponse(&apiv1.GetFlavorResponse{Flavor: FlavorProto(r.obj)}), nil
}

// List lists the scope's flavors and, for a tenant, the platform's.
func (s *FlavorService) List(ctx context.Context, req *connect.Request[apiv1.ListFlavorsRequest]) (*connect.Response[apiv1.ListFlavorsResponse], error) {
	flavors, next, err := tenancy.ListPage(ctx, s.env, req.Msg, "flavors",
		func(ctx context.Context, q store.Querier, sc scope, after string, limit int) ([]Flavor, error) {
			return FlavorList(ctx, q, []string{sc.ID(), ""}, after, limit)
		}, func(f Flavor) string { return f.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListFlavorsResponse{NextPageToken: next}
	for _, f := range flavors {
		out.Flavors = append(out.Flavors, FlavorProto(f))
	}
	return connect.NewResponse(out), nil
}

// Delete removes a flavor of the scope.
func (s *FlavorService) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteFlavorRequest]) (*connect.Response[apiv1.DeleteFlavorResponse], error) {
	msg := req.Msg
	var r flavorRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteFlavorResponse]{
		// A refusal past the decision (a name taken, a pool with leases)
		// stays on record.
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("flavor", msg.GetFlavor(), FlavorIDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			// Only the scope's own: a tenant never deletes a platform flavor.
			r, err = lookupFlavor(ctx, q, msg.GetTenant(), msg.GetFlavor(), false)
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteFlavorResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			f, err := FlavorGet(ctx, tx, r.obj.TenantID, r.obj.ID, store.ForUpdate(tx))
			if errors.Is(err, store.ErrNotFound) {
				return nil, envelope.NotFound("flavor", msg.GetFlavor())
			}
			if err != nil {
				return nil, err
			}
			// An instance of the flavor keeps it: its row names the flavor,
			// and a platform flavor is every tenant's.
			n, err := InstancesWithFlavor(ctx, tx, f.ID)
			if err != nil {
				return nil, err
			}
			if n > 0 {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
					"flavor %s is used by %d instance(s): delete them first", f.Name, n)
			}
			if err := FlavorDelete(ctx, tx, f.ID); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "flavor.deleted", TenantID: f.TenantID, ResourceType: "Flavor", ResourceID: f.ID,
				Data: map[string]any{"name": f.Name}})
			return &apiv1.DeleteFlavorResponse{}, nil
		},
	})
}

// FlavorProto converts a flavor for the API.
func FlavorProto(f Flavor) *apiv1.Flavor {
	return &apiv1.Flavor{Id: f.ID, TenantId: f.TenantID, Name: f.Name, Vcpus: f.VCPUs, MemoryMib: f.MemoryMiB, DiskGib: f.DiskGiB,
		Gpus: f.GPUs, GpuModel: f.GPUModel, NumaAffine: f.NUMAAffine, Pinned: f.Pinned, Hugepages: f.Hugepages,
		Description: f.Description, CreateTime: timestamppb.New(f.CreateTime), Balloon: f.Balloon, MinMemoryMib: f.MinMemoryMiB}
}
