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

// refuse is a FAILED_PRECONDITION naming the request field it is about.
func refuse(field, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	return &envelope.Error{Code: envelope.CodeFailedPrecondition, Message: msg, Violations: []envelope.Violation{{Field: field, Reason: msg}}}
}

// attachParams is the volume.attach (and volume.detach) command of v.
func attachParams(v *Volume, instanceID string) vmcmd.AttachParams {
	return vmcmd.AttachParams{InstanceID: HostID(instanceID), VolumeID: HostID(v.ID), Format: v.Format}
}

// Attach hot-plugs an available volume into a running or stopped
// instance of the same tenant on the volume's host. The volume is
// attaching until bcd answers volume.attach (CommandDone), then attached;
// a failure leaves it available with the host's message. Attaching it
// again to the same instance changes nothing.
func (vs *VolumeService) Attach(ctx context.Context, req *connect.Request[apiv1.AttachVolumeRequest]) (*connect.Response[apiv1.AttachVolumeResponse], error) {
	msg := req.Msg
	s := vs.s
	var (
		r   volumeRef
		ir  instanceRef
		cur Volume
	)
	_, err := envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.Volume]{
		Validate: func() error {
			var v envelope.Violations
			v.Ref("tenant", msg.GetTenant(), "tnt")
			v.Ref("volume", msg.GetVolume(), VolumeIDPrefix)
			v.Ref("instance", msg.GetInstance(), InstanceIDPrefix)
			return v.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if r, err = lookupVolume(ctx, q, msg.GetTenant(), msg.GetVolume()); err != nil {
				return r.Resource(), err
			}
			// The instance is looked up in the volume's tenant: another
			// tenant's is not found, as any id of theirs.
			ir, err = lookupInstance(ctx, q, msg.GetTenant(), msg.GetInstance())
			return r.Resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.Volume, error) {
			if err := r.NotFound(msg.GetVolume()); err != nil {
				return nil, err
			}
			if err := ir.NotFound(msg.GetInstance()); err != nil {
				return nil, err
			}
			var err error
			// Instance first, then volume: the order instance delete
			// (which detaches its volumes) takes them in.
			in, err := InstanceByID(ctx, tx.Tx, ir.Obj.ID, store.ForUpdate(tx.Tx))
			if err != nil {
				return nil, envelope.FromStore(err, "instance")
			}
			if cur, err = VolumeByID(ctx, tx.Tx, r.Obj.ID, store.ForUpdate(tx.Tx)); err != nil {
				return nil, envelope.FromStore(err, "volume")
			}
			if cur.InstanceID == in.ID && (cur.State == VolumeAttaching || cur.State == VolumeAttached) {
				return VolumeProto(cur), nil // attached (or on its way) already
			}
			if err := s.attachable(ctx, tx, &cur, &in); err != nil {
				return nil, err
			}
			now := tx.Now()
			cur.State, cur.InstanceID, cur.Message, cur.UpdateTime = VolumeAttaching, in.ID, "", now
			if err := VolumeSave(ctx, tx.Tx, &cur); err != nil {
				return nil, err
			}
			if _, err := s.send(ctx, tx.Tx, &in, vmcmd.KindVolumeAttach, attachParams(&cur, in.ID),
				fmt.Sprintf("%s/attach/%d", cur.ID, now.UnixNano()), now); err != nil {
				return nil, err
			}
			tx.Emit(volumeEvent("volume.attaching", &cur))
			return VolumeProto(cur), nil
		},
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.AttachVolumeResponse{Volume: VolumeProto(cur)}), nil
}

// attachable refuses what cannot take the attach, naming the field.
func (s *InstanceService) attachable(ctx context.Context, tx *envelope.Tx, v *Volume, in *Instance) error {
	switch {
	case v.State == VolumeDetaching:
		return refuse("volume", "volume %s is detaching from instance %s: attach it once it is available", v.Name, v.InstanceID)
	case v.InstanceID != "":
		return refuse("volume", "volume %s is attached to instance %s: detach it first", v.Name, v.InstanceID)
	case v.State != VolumeAvailable:
		return refuse("volume", "volume %s is %s: only an available volume attaches", v.Name, v.State)
	case in.State != StateRunning && in.State != StateStopped:
		return refuse("instance", "instance %s is %s: a volume attaches to a running or stopped instance", in.Name, in.State)
	case in.NodeID != v.NodeID:
		return refuse("instance", "volume %s is on host %s and instance %s on host %s (%s): a volume attaches only on its own host",
			v.Name, v.NodeID, in.Name, in.NodeID, in.NodeName)
	}
	return s.checkOwner(ctx, tx.Tx, in)
}

// Detach takes a volume off its instance. A running or stopped instance
// gets volume.detach (the volume is detaching until bcd confirms the guest
// released it, then available); one that no longer holds a guest (failed,
// lost, deleted) lets it go at once. Detaching a detached volume changes
// nothing.
func (vs *VolumeService) Detach(ctx context.Context, req *connect.Request[apiv1.DetachVolumeRequest]) (*connect.Response[apiv1.DetachVolumeResponse], error) {
	s := vs.s
	v, err := volumeMutation(ctx, vs, req, req.Msg.GetTenant(), req.Msg.GetVolume(), func(ctx context.Context, tx *envelope.Tx, v *Volume) error {
		if v.InstanceID == "" || v.State == VolumeDetaching {
			return nil // detached already, or on its way
		}
		in, err := InstanceByID(ctx, tx.Tx, v.InstanceID, store.ForUpdate(tx.Tx))
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		now := tx.Now()
		switch {
		case err != nil || in.State == StateFailed || in.State == StateLost || in.State == StateDeleted:
			// No guest holds it: it is free now.
			v.State, v.InstanceID = VolumeAvailable, ""
		case v.State == VolumeAttaching:
			return refuse("volume", "volume %s is still attaching to instance %s: detach it once attached", v.Name, in.Name)
		case in.State != StateRunning && in.State != StateStopped:
			return refuse("volume", "volume %s is attached to instance %s, which is %s: a volume detaches from a running or stopped instance (or goes with its delete)",
				v.Name, in.Name, in.State)
		default:
			if err := s.checkOwner(ctx, tx.Tx, &in); err != nil {
				return err
			}
			v.State = VolumeDetaching
			if _, err := s.send(ctx, tx.Tx, &in, vmcmd.KindVolumeDetach, attachParams(v, in.ID),
				fmt.Sprintf("%s/detach/%d", v.ID, now.UnixNano()), now); err != nil {
				return err
			}
		}
		v.Message, v.UpdateTime = "", now
		if err := VolumeSave(ctx, tx.Tx, v); err != nil {
			return err
		}
		if v.State == VolumeDetaching {
			tx.Emit(volumeEvent("volume.detaching", v))
		} else {
			tx.Emit(volumeEvent("volume.detached", v))
		}
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
