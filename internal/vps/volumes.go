package vps

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// VolumeService serves VolumeService: host volumes live on their
// instance's host, and bcd creates and removes their files.
type VolumeService struct {
	s *InstanceService
}

// NewVolumeService returns the volume handlers; the instance service sends
// their commands and converges them.
func NewVolumeService(s *InstanceService) *VolumeService { return &VolumeService{s: s} }

// VolumeResource projects a volume into the authorization model.
func VolumeResource(v Volume) iam.Resource {
	return iam.Resource{Type: "Volume", ID: v.ID, TenantID: v.TenantID, Attrs: map[string]any{"name": v.Name, "sizeGiB": int64(v.SizeGiB)}}
}

// VolumeProto converts a volume for the API.
func VolumeProto(v Volume) *apiv1.Volume {
	return &apiv1.Volume{Id: v.ID, TenantId: v.TenantID, Name: v.Name, SizeGib: v.SizeGiB, Format: v.Format, State: v.State,
		InstanceId: v.InstanceID, NodeId: v.NodeID, Message: v.Message, CreateTime: timestamppb.New(v.CreateTime),
		UpdateTime: timestamppb.New(v.UpdateTime)}
}

func volumeEvent(typ string, v *Volume) envelope.Event {
	return envelope.Event{Type: typ, TenantID: v.TenantID, ResourceType: "Volume", ResourceID: v.ID,
		Data: map[string]any{"name": v.Name, "state": v.State, "instance_id": v.InstanceID}}
}

// Create makes a detached volume on the host of the instance the request
// names.
func (vs *VolumeService) Create(ctx context.Context, req *connect.Request[apiv1.CreateVolumeRequest]) (*connect.Response[apiv1.CreateVolumeResponse], error) {
	msg := req.Msg
	s := vs.s
	var r instanceRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateVolumeResponse]{
		Validate: func() error {
			var v envelope.Violations
			v.Ref("tenant", msg.GetTenant(), "tnt")
			validateVolumeSpec(&v, "volume", msg.GetName(), msg.GetSizeGib(), msg.GetFormat())
			v.Ref("instance", msg.GetInstance(), InstanceIDPrefix)
			return prefixVolume(v.Err())
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if r, err = lookupInstance(ctx, q, msg.GetTenant(), msg.GetInstance()); err != nil || !r.Scope.Found {
				return iam.Resource{Type: "Volume", ID: iam.DraftID}, err
			}
			return iam.Resource{Type: "Volume", ID: iam.DraftID, TenantID: r.Scope.ID(),
				Attrs: map[string]any{"name": msg.GetName(), "sizeGiB": int64(msg.GetSizeGib())}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateVolumeResponse, error) {
			if err := r.NotFound(msg.GetInstance()); err != nil {
				return nil, err
			}
			in, err := InstanceByID(ctx, tx.Tx, r.Obj.ID, store.ForUpdate(tx.Tx))
			if err != nil {
				return nil, envelope.FromStore(err, "instance")
			}
			if !in.Live() || in.State == StateDeleting || in.NodeID == "" {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "instance %s is %s: it has no host to hold a volume", in.Name, in.State)
			}
			now := tx.Now()
			v := Volume{ID: envelope.NewID(VolumeIDPrefix, now), TenantID: in.TenantID, Name: msg.GetName(), SizeGiB: msg.GetSizeGib(),
				Format: formatOf(msg.GetFormat()), State: VolumeCreating, NodeID: in.NodeID, CreateTime: now, UpdateTime: now}
			if err := VolumeInsert(ctx, tx.Tx, &v); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "a volume named %q already exists", v.Name)
				}
				return nil, err
			}
			if _, err := s.send(ctx, tx.Tx, &in, vmcmd.KindVolumeCreate, vmcmd.VolumeParams{VolumeID: HostID(v.ID), Format: v.Format,
				SizeMiB: int(v.SizeGiB) * 1024}, v.ID+"/create", now); err != nil {
				return nil, err
			}
			tx.SetResource(v.ID, "")
			tx.Emit(volumeEvent("volume.created", &v))
			return &apiv1.CreateVolumeResponse{Volume: VolumeProto(v)}, nil
		},
	})
}

// prefixVolume leaves the create's own fields as the request names them
// (validateVolumeSpec names them under a parent).
func prefixVolume(err error) error {
	var e *envelope.Error
	if !errors.As(err, &e) {
		return err
	}
	out := *e
	out.Violations = make([]envelope.Violation, len(e.Violations))
	for i, v := range e.Violations {
		f := v.Field
		if len(f) > len("volume.") && f[:len("volume.")] == "volume." {
			f = f[len("volume."):]
		}
		out.Violations[i] = envelope.Violation{Field: f, Reason: v.Reason}
	}
	return &out
}

// volumeRef is a volume resolved before a decision.
type volumeRef = tenancy.Item[Volume]

var volumeKind = tenancy.ItemKind[Volume]{Type: "Volume", Noun: "volume", Resource: VolumeResource,
	Get: func(ctx context.Context, q store.Querier, tenantID, ref string) (Volume, error) {
		return VolumeGet(ctx, q, tenantID, ref, "")
	}}

func lookupVolume(ctx context.Context, q store.Querier, tenantRef, ref string) (volumeRef, error) {
	return volumeKind.Lookup(ctx, q, tenantRef, ref)
}

// Get reads a volume.
func (vs *VolumeService) Get(ctx context.Context, req *connect.Request[apiv1.GetVolumeRequest]) (*connect.Response[apiv1.GetVolumeResponse], error) {
	msg := req.Msg
	s := vs.s
	var v envelope.Violations
	v.Ref("tenant", msg.GetTenant(), "tnt")
	v.Ref("volume", msg.GetVolume(), VolumeIDPrefix)
	if err := v.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var r volumeRef
	if err := s.env.Resolve(ctx, "volume", func(ctx context.Context, q store.Querier) (err error) {
		r, err = lookupVolume(ctx, q, msg.GetTenant(), msg.GetVolume())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.Resource()); err != nil {
		return nil, err
	}
	if err := r.NotFound(msg.GetVolume()); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetVolumeResponse{Volume: VolumeProto(r.Obj)}), nil
}

// List lists a tenant's volumes.
func (vs *VolumeService) List(ctx context.Context, req *connect.Request[apiv1.ListVolumesRequest]) (*connect.Response[apiv1.ListVolumesResponse], error) {
	vols, next, err := tenancy.ListPage(ctx, vs.s.env, req.Msg, "volumes",
		func(ctx context.Context, q store.Querier, sc scope, after string, limit int) ([]Volume, error) {
			return VolumeList(ctx, q, sc.ID(), after, limit)
		}, func(v Volume) string { return v.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListVolumesResponse{NextPageToken: next}
	for _, v := range vols {
		out.Volumes = append(out.Volumes, VolumeProto(v))
	}
	return connect.NewResponse(out), nil
}

// volumeMutation runs one stored volume's change.
func volumeMutation[Req any](ctx context.Context, vs *VolumeService, req *connect.Request[Req], tenant, ref string,
	apply func(ctx context.Context, tx *envelope.Tx, v *Volume) error) (*Volume, error) {
	s := vs.s
	var (
		r   volumeRef
		cur Volume
	)
	_, err := envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.Volume]{
		Validate: func() error {
			var v envelope.Violations
			v.Ref("tenant", tenant, "tnt")
			v.Ref("volume", ref, VolumeIDPrefix)
			return v.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupVolume(ctx, q, tenant, ref)
			return r.Resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.Volume, error) {
			if err := r.NotFound(ref); err != nil {
				return nil, err
			}
			var err error
			if cur, err = VolumeByID(ctx, tx.Tx, r.Obj.ID, store.ForUpdate(tx.Tx)); err != nil {
				return nil, envelope.FromStore(err, "volume")
			}
			if err := apply(ctx, tx, &cur); err != nil {
				return nil, err
			}
			return VolumeProto(cur), nil
		},
	})
	return &cur, err
}

// Detach takes a volume off an instance that no longer holds a guest
// (failed or lost). bcd attaches volumes when it creates a guest and has
// no hot detach, so a live instance's volumes go with its delete.
func (vs *VolumeService) Detach(ctx context.Context, req *connect.Request[apiv1.DetachVolumeRequest]) (*connect.Response[apiv1.DetachVolumeResponse], error) {
	v, err := volumeMutation(ctx, vs, req, req.Msg.GetTenant(), req.Msg.GetVolume(), func(ctx context.Context, tx *envelope.Tx, v *Volume) error {
		if v.InstanceID == "" {
			return nil // detached already
		}
		in, err := InstanceByID(ctx, tx.Tx, v.InstanceID, store.ForUpdate(tx.Tx))
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err == nil && (in.State != StateFailed && in.State != StateLost && in.State != StateDeleted) {
			return envelope.Errorf(envelope.CodeFailedPrecondition,
				"volume %s is attached to instance %s, which is %s: delete the instance first (volumes attach when the guest is created)",
				v.Name, in.Name, in.State)
		}
		v.InstanceID, v.UpdateTime = "", tx.Now()
		if v.State == VolumeAttached {
			v.State = VolumeAvailable
		}
		if err := VolumeSave(ctx, tx.Tx, v); err != nil {
			return err
		}
		tx.Emit(volumeEvent("volume.detached", v))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.DetachVolumeResponse{Volume: VolumeProto(*v)}), nil
}

// Delete removes a detached volume from its host; deleting twice changes
// nothing.
func (vs *VolumeService) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteVolumeRequest]) (*connect.Response[apiv1.DeleteVolumeResponse], error) {
	s := vs.s
	v, err := volumeMutation(ctx, vs, req, req.Msg.GetTenant(), req.Msg.GetVolume(), func(ctx context.Context, tx *envelope.Tx, v *Volume) error {
		switch {
		case v.State == VolumeDeleted || v.State == VolumeDeleting:
			return nil
		case v.InstanceID != "":
			return envelope.Errorf(envelope.CodeFailedPrecondition, "volume %s is attached to instance %s: delete the instance (or detach the volume) first",
				v.Name, v.InstanceID)
		}
		now := tx.Now()
		if v.NodeID == "" || v.State == VolumeFailed {
			v.State = VolumeDeleted
		} else {
			v.State = VolumeDeleting
			host := Instance{TenantID: v.TenantID, NodeID: v.NodeID}
			if _, err := s.send(ctx, tx.Tx, &host, vmcmd.KindVolumeDelete, vmcmd.VolumeParams{VolumeID: HostID(v.ID), Format: v.Format,
				SizeMiB: int(v.SizeGiB) * 1024}, fmt.Sprintf("%s/delete/%d", v.ID, now.UnixNano()), now); err != nil {
				return err
			}
		}
		v.UpdateTime = now
		if err := VolumeSave(ctx, tx.Tx, v); err != nil {
			return err
		}
		tx.Emit(volumeEvent("volume."+v.State, v))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.DeleteVolumeResponse{Volume: VolumeProto(*v)}), nil
}
