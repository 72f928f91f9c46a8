package sandbox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
	"github.com/better-compute/better-compute/internal/vmcmd"
	"github.com/better-compute/better-compute/internal/vps"
)

// Sandbox origins.
const (
	OriginWarm = "warm"
	OriginCold = "cold"
)

// systemActor creates warm instances and expires sandboxes.
const systemActor = "system:sandboxes"

// EnvPath is where a sandbox's environment is written in the guest.
const EnvPath = "/etc/sandbox/env"

// Service serves SandboxService and runs the warm pool and TTL sweeps.
type Service struct {
	env    *envelope.Envelope
	db     *store.DB
	inst   *vps.InstanceService
	sealer secrets.Sealer
	rec    envelope.Recorder
}

var _ apiv1connect.SandboxServiceHandler = (*Service)(nil)

// Config wires the sandbox service.
type Config struct {
	Env       *envelope.Envelope
	DB        *store.DB
	Instances *vps.InstanceService
	// Sealer opens the tenant secrets a template's env names.
	Sealer secrets.Sealer
	// Recorder writes events of the sweeps (no request, no audit row).
	Recorder envelope.Recorder
}

// New returns the sandbox service; it makes the instance service refuse
// item methods on sandboxes' and warm pools' instances.
func New(cfg Config) *Service {
	cfg.Instances.SetOwner(OwnerOf)
	return &Service{env: cfg.Env, db: cfg.DB, inst: cfg.Instances, sealer: cfg.Sealer, rec: cfg.Recorder}
}

// Templates returns the SandboxTemplateService handler.
func (s *Service) Templates() *TemplateService { return &TemplateService{s: s} }

// Resource projects a sandbox into the authorization model.
func Resource(sb Sandbox) iam.Resource {
	return iam.Resource{Type: "Sandbox", ID: sb.ID, TenantID: sb.TenantID, Attrs: map[string]any{
		"template": sb.TemplateName, "lifetimeSeconds": int64(sb.ExpireTime.Sub(sb.CreateTime) / time.Second)}}
}

// stateOf is a sandbox's state from its row and its instance's.
func stateOf(sb Sandbox, in *vps.Instance) string {
	if sb.State == SandboxDeleted {
		return "deleted"
	}
	if in == nil {
		return "starting"
	}
	switch in.State {
	case vps.StateRunning:
		// A claimed warm guest is paused until it answers instance.resume.
		if sb.Origin == OriginWarm && !sb.Resumed {
			return "starting"
		}
		if sb.Restoring != "" {
			return "restoring"
		}
		return "running"
	case vps.StateDeleting:
		return "deleting"
	case vps.StateDeleted:
		return "deleted"
	case vps.StateFailed, vps.StateLost, vps.StateStopped:
		return "failed"
	}
	return "starting"
}

// Proto converts a sandbox for the API.
func Proto(sb Sandbox, in *vps.Instance) *apiv1.Sandbox {
	out := &apiv1.Sandbox{Id: sb.ID, TenantId: sb.TenantID, TemplateId: sb.TemplateID, Template: sb.TemplateName, InstanceId: sb.InstanceID,
		State: stateOf(sb, in), Origin: sb.Origin, ExpireTime: timestamppb.New(sb.ExpireTime),
		CreateTime: timestamppb.New(sb.CreateTime), UpdateTime: timestamppb.New(sb.UpdateTime)}
	if in != nil {
		out.Address, out.NodeId = in.Address, in.NodeID
	}
	return out
}

func sandboxEvent(typ string, sb *Sandbox, data map[string]any) envelope.Event {
	if data == nil {
		data = map[string]any{}
	}
	data["template_id"], data["instance_id"] = sb.TemplateID, sb.InstanceID
	return envelope.Event{Type: typ, TenantID: sb.TenantID, ResourceType: "Sandbox", ResourceID: sb.ID, Data: data}
}

// userData writes the template's environment into the guest: the tenant's
// secrets are opened here, in the transaction that boots the guest, and
// travel only in the instance's seed.
func (s *Service) userData(ctx context.Context, q store.Querier, t Template) (string, error) {
	if len(t.Env) == 0 {
		return "", nil
	}
	var b strings.Builder
	for _, k := range sortedKeys(t.Env) {
		v, err := secrets.Open(ctx, q, s.sealer, t.TenantID, t.Env[k])
		if errors.Is(err, secrets.ErrNotFound) {
			return "", envelope.Errorf(envelope.CodeFailedPrecondition, "template %s: env %s names a secret the tenant no longer has", t.Name, k)
		}
		if err != nil {
			return "", fmt.Errorf("template %s: env %s: %w", t.Name, k, err)
		}
		// Single-quoted for a shell's `. /etc/sandbox/env`.
		fmt.Fprintf(&b, "%s='%s'\n", k, strings.ReplaceAll(string(v.Bytes), "'", `'\''`))
	}
	return "#cloud-config\nwrite_files:\n  - path: " + EnvPath + "\n    permissions: '0600'\n    encoding: b64\n    content: " +
		base64.StdEncoding.EncodeToString([]byte(b.String())) + "\n", nil
}

// bootFor resolves the instance a template boots.
func (s *Service) bootFor(ctx context.Context, q store.Querier, tenant, name string, t Template, userData string) (*vps.Boot, error) {
	m := bootRequest(tenant, name, t)
	m.UserData = userData
	return s.inst.ResolveBoot(ctx, q, m)
}

func hostName(prefix string, now time.Time) string {
	return strings.ReplaceAll(envelope.NewID(prefix, now), "_", "-")
}

// Create claims a warm instance of the template's shape (after the one
// decision), or boots one.
func (s *Service) Create(ctx context.Context, req *connect.Request[apiv1.CreateSandboxRequest]) (*connect.Response[apiv1.CreateSandboxResponse], error) {
	msg := req.Msg
	var r templateRef
	ttl := durationOr(msg.GetTtl(), 0)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateSandboxResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			vs.Ref("template", msg.GetTemplate(), TemplateIDPrefix)
			if msg.GetTtl() != nil && (ttl <= 0 || ttl%time.Second != 0) {
				vs.Add("ttl", "must be a positive whole number of seconds, got %s", ttl)
			}
			if msg.GetFromSnapshot() != "" {
				vs.ID("from_snapshot", msg.GetFromSnapshot(), SnapshotIDPrefix)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if r, err = lookupTemplate(ctx, q, msg.GetTenant(), msg.GetTemplate()); err != nil || !r.Scope.Found {
				return iam.Resource{Type: "Sandbox", ID: iam.DraftID}, err
			}
			life := ttl
			if life == 0 && r.Found {
				life = r.Obj.DefaultTTL
			}
			return iam.Resource{Type: "Sandbox", ID: iam.DraftID, TenantID: r.Scope.ID(), Attrs: map[string]any{
				"template": msg.GetTemplate(), "lifetimeSeconds": int64(life / time.Second)}}, nil
		},
		Submit: func(ctx context.Context, write func(ctx context.Context, b *envelope.Batch) error) error {
			if !r.Found {
				return s.env.CommitAlone(ctx, write)
			}
			return s.inst.Submit(ctx, r.Obj.PoolID, r.Obj.TenantID, write)
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateSandboxResponse, error) {
			if err := r.NotFound(msg.GetTemplate()); err != nil {
				return nil, err
			}
			t := r.Obj
			life := ttl
			if life == 0 {
				life = t.DefaultTTL
			}
			if life > t.MaxTTL {
				return nil, envelope.Invalid(envelope.Violation{Field: "ttl", Reason: fmt.Sprintf("template %s allows at most %s, got %s", t.Name, t.MaxTTL, life)})
			}
			now := tx.Now()
			sb := Sandbox{ID: envelope.NewID(SandboxIDPrefix, now), TenantID: t.TenantID, TemplateID: t.ID, TemplateName: t.Name,
				State: SandboxActive, CreatedBy: tx.Caller().Principal.ID, ExpireTime: now.Add(life), CreateTime: now, UpdateTime: now,
				MaxTTL: t.MaxTTL}
			var seed *Snapshot
			if id := msg.GetFromSnapshot(); id != "" {
				snap, err := seedFrom(ctx, tx.Tx, t, id)
				if err != nil {
					return nil, err
				}
				seed = &snap
			}
			in, err := s.claimOrBoot(ctx, tx, t, &sb, now, seed)
			if err != nil {
				return nil, err
			}
			sb.InstanceID = in.ID
			if err := SandboxInsert(ctx, tx.Tx, &sb); err != nil {
				return nil, err
			}
			tx.SetResource(sb.ID, "")
			data := map[string]any{"origin": sb.Origin, "expire_time": sb.ExpireTime}
			if seed != nil {
				data["from_snapshot"] = seed.ID
			}
			tx.Emit(sandboxEvent("sandbox.created", &sb, data))
			return &apiv1.CreateSandboxResponse{Sandbox: Proto(sb, &in)}, nil
		},
	})
}

// claimOrBoot takes a warm instance of the template's current shape and
// resumes it, or boots a new one: from seed's disk, on seed's node, when
// seed is set (a warm guest booted from the image cannot be one). Every
// refusal comes before a write.
func (s *Service) claimOrBoot(ctx context.Context, tx *envelope.Tx, t Template, sb *Sandbox, now time.Time, seed *Snapshot) (vps.Instance, error) {
	var id string
	if seed == nil {
		var err error
		if id, err = WarmClaim(ctx, tx.Tx, t.ID, t.Shape); err != nil {
			return vps.Instance{}, err
		}
	}
	if id != "" {
		in, err := vps.InstanceByID(ctx, tx.Tx, id, store.ForUpdate(tx.Tx))
		if err != nil {
			return in, fmt.Errorf("warm instance %s: %w", id, err)
		}
		key := fmt.Sprintf("%s/resume/%s", in.ID, sb.ID)
		if _, err := s.inst.SendIn(ctx, tx.Tx, &in, vmcmd.KindInstanceResume, vmcmd.InstanceRef{InstanceID: vps.HostID(in.ID)}, key, now); err != nil {
			return in, err
		}
		sb.Origin = OriginWarm
		return in, nil
	}
	ud, err := s.userData(ctx, tx.Tx, t)
	if err != nil {
		return vps.Instance{}, err
	}
	boot, err := s.bootFor(ctx, tx.Tx, t.TenantID, strings.ReplaceAll(sb.ID, "_", "-"), t, ud)
	if err != nil {
		return vps.Instance{}, err
	}
	if seed != nil {
		if err := s.checkSeed(t, boot, *seed); err != nil {
			return vps.Instance{}, err
		}
		boot.FromSnapshot(seed.NodeID, seed.InstanceID, seed.ID)
	}
	in, err := s.inst.BootIn(ctx, tx.Tx, tx.Emit, now, tx.Caller().Principal.ID, boot, false)
	if err != nil {
		return in, err
	}
	sb.Origin = OriginCold
	return in, nil
}

// sandboxRef is a sandbox resolved before a decision.
type sandboxRef = tenancy.Item[Sandbox]

var sandboxKind = tenancy.ItemKind[Sandbox]{Type: "Sandbox", Noun: "sandbox", Resource: Resource,
	Get: func(ctx context.Context, q store.Querier, tenantID, id string) (Sandbox, error) {
		return SandboxGet(ctx, q, tenantID, id, "")
	}}

func lookupSandbox(ctx context.Context, q store.Querier, tenantRef, id string) (sandboxRef, error) {
	return sandboxKind.Lookup(ctx, q, tenantRef, id)
}

func validateSandboxRef(vs *envelope.Violations, tenant, ref string) {
	vs.Ref("tenant", tenant, "tnt")
	vs.ID("sandbox", ref, SandboxIDPrefix)
}

func instanceOf(ctx context.Context, q store.Querier, sb Sandbox) (*vps.Instance, error) {
	in, err := vps.InstanceByID(ctx, q, sb.InstanceID, "")
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	return &in, err
}

// Get reads a sandbox.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetSandboxRequest]) (*connect.Response[apiv1.GetSandboxResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateSandboxRef(&vs, msg.GetTenant(), msg.GetSandbox())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		r  sandboxRef
		in *vps.Instance
	)
	if err := s.env.Resolve(ctx, "sandbox", func(ctx context.Context, q store.Querier) (err error) {
		if r, err = lookupSandbox(ctx, q, msg.GetTenant(), msg.GetSandbox()); err != nil || !r.Found {
			return err
		}
		in, err = instanceOf(ctx, q, r.Obj)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.Resource()); err != nil {
		return nil, err
	}
	if err := r.NotFound(msg.GetSandbox()); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetSandboxResponse{Sandbox: Proto(r.Obj, in)}), nil
}

// List lists a tenant's live sandboxes.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListSandboxesRequest]) (*connect.Response[apiv1.ListSandboxesResponse], error) {
	type row struct {
		sb Sandbox
		in *vps.Instance
	}
	rows, next, err := tenancy.ListPage(ctx, s.env, req.Msg, "sandboxes",
		func(ctx context.Context, q store.Querier, sc tenancy.Scope, after string, limit int) ([]row, error) {
			sbs, err := SandboxList(ctx, q, sc.ID(), after, limit)
			if err != nil {
				return nil, err
			}
			out := make([]row, len(sbs))
			for i, sb := range sbs {
				out[i].sb = sb
				if out[i].in, err = instanceOf(ctx, q, sb); err != nil {
					return nil, err
				}
			}
			return out, nil
		}, func(r row) string { return r.sb.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListSandboxesResponse{NextPageToken: next}
	for _, r := range rows {
		out.Sandboxes = append(out.Sandboxes, Proto(r.sb, r.in))
	}
	return connect.NewResponse(out), nil
}

// mutateSandbox runs a sandbox mutation under the request's envelope.
func mutateSandbox[Req any](ctx context.Context, s *Service, req *connect.Request[Req], tenant, ref string, validate func(*envelope.Violations),
	decisionCtx func(r sandboxRef) map[string]any, apply func(ctx context.Context, tx *envelope.Tx, sb *Sandbox, in *vps.Instance) error) (*apiv1.Sandbox, error) {
	var r sandboxRef
	m := envelope.Mutation[apiv1.Sandbox]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			validateSandboxRef(&vs, tenant, ref)
			if validate != nil {
				validate(&vs)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupSandbox(ctx, q, tenant, ref)
			return r.Resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.Sandbox, error) {
			if err := r.NotFound(ref); err != nil {
				return nil, err
			}
			sb, err := SandboxGet(ctx, tx.Tx, r.Obj.TenantID, r.Obj.ID, store.ForUpdate(tx.Tx))
			if err != nil {
				return nil, envelope.FromStore(err, "sandbox")
			}
			in, err := instanceOf(ctx, tx.Tx, sb)
			if err != nil {
				return nil, err
			}
			if err := apply(ctx, tx, &sb, in); err != nil {
				return nil, err
			}
			return Proto(sb, in), nil
		},
	}
	if decisionCtx != nil {
		m.Context = func() map[string]any { return decisionCtx(r) }
	}
	res, err := envelope.Mutate(ctx, s.env, req, m)
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// Extend sets a sandbox's lifetime, counted from its create: decided with
// the new lifetime, bounded by its template's max_ttl.
func (s *Service) Extend(ctx context.Context, req *connect.Request[apiv1.ExtendSandboxRequest]) (*connect.Response[apiv1.ExtendSandboxResponse], error) {
	msg := req.Msg
	ttl := durationOr(msg.GetTtl(), 0)
	out, err := mutateSandbox(ctx, s, req, msg.GetTenant(), msg.GetSandbox(), func(vs *envelope.Violations) {
		if ttl <= 0 || ttl%time.Second != 0 {
			vs.Add("ttl", "must be a positive whole number of seconds, got %s", ttl)
		}
	}, func(sandboxRef) map[string]any {
		return map[string]any{"lifetimeSeconds": int64(ttl / time.Second)}
	}, func(ctx context.Context, tx *envelope.Tx, sb *Sandbox, _ *vps.Instance) error {
		if sb.State != SandboxActive {
			return envelope.Errorf(envelope.CodeFailedPrecondition, "sandbox %s is deleted", sb.ID)
		}
		// The bound recorded at create: the template may be gone since
		// (sandboxes outlive their template).
		if sb.MaxTTL <= 0 {
			return envelope.Errorf(envelope.CodeFailedPrecondition, "sandbox %s: its template %s was deleted before its lifetime bound was recorded, so it cannot be extended",
				sb.ID, sb.TemplateName)
		}
		if ttl > sb.MaxTTL {
			return envelope.Invalid(envelope.Violation{Field: "ttl", Reason: fmt.Sprintf("template %s allows at most %s from create, got %s", sb.TemplateName, sb.MaxTTL, ttl)})
		}
		now := tx.Now()
		exp := sb.CreateTime.Add(ttl)
		if !exp.After(now) {
			return envelope.Invalid(envelope.Violation{Field: "ttl", Reason: fmt.Sprintf("ends before now (the sandbox is %s old)", now.Sub(sb.CreateTime).Round(time.Second))})
		}
		old := sb.ExpireTime
		sb.ExpireTime, sb.UpdateTime = exp, now
		if err := SandboxSave(ctx, tx.Tx, sb); err != nil {
			return err
		}
		tx.Emit(sandboxEvent("sandbox.extended", sb, map[string]any{"expire_time": exp, "previous_expire_time": old}))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.ExtendSandboxResponse{Sandbox: out}), nil
}

// deleteIn deletes a sandbox and its instance in tx.
func (s *Service) deleteIn(ctx context.Context, tx store.Tx, emit func(envelope.Event), sb *Sandbox, in *vps.Instance, now time.Time) error {
	if sb.State == SandboxDeleted {
		return nil
	}
	kept, err := SnapshotsKept(ctx, tx, sb.ID)
	if err != nil {
		return err
	}
	if in != nil {
		cur, err := vps.InstanceByID(ctx, tx, in.ID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		if err := s.inst.DeleteKeeping(ctx, tx, emit, &cur, now, snapshotIDs(kept)); err != nil {
			return err
		}
		*in = cur
	}
	sb.State, sb.UpdateTime = SandboxDeleted, now
	if err := SandboxSave(ctx, tx, sb); err != nil {
		return err
	}
	if err := SnapshotsDeleteOfSandbox(ctx, tx, sb.ID); err != nil {
		return err
	}
	var data map[string]any
	if len(kept) > 0 {
		data = map[string]any{"kept_snapshots": snapshotIDs(kept)}
	}
	emit(sandboxEvent("sandbox.deleted", sb, data))
	return nil
}

// Delete deletes a sandbox and its instance; deleting twice changes
// nothing.
func (s *Service) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteSandboxRequest]) (*connect.Response[apiv1.DeleteSandboxResponse], error) {
	msg := req.Msg
	out, err := mutateSandbox(ctx, s, req, msg.GetTenant(), msg.GetSandbox(), nil, nil,
		func(ctx context.Context, tx *envelope.Tx, sb *Sandbox, in *vps.Instance) error {
			return s.deleteIn(ctx, tx.Tx, tx.Emit, sb, in, tx.Now())
		})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.DeleteSandboxResponse{Sandbox: out}), nil
}

// Snapshot saves a running sandbox's memory, device state and disks on its
// host into the tenant's private snapshot table.
func (s *Service) Snapshot(ctx context.Context, req *connect.Request[apiv1.SnapshotSandboxRequest]) (*connect.Response[apiv1.SnapshotSandboxResponse], error) {
	msg := req.Msg
	var snap Snapshot
	_, err := mutateSandbox(ctx, s, req, msg.GetTenant(), msg.GetSandbox(), nil, nil,
		func(ctx context.Context, tx *envelope.Tx, sb *Sandbox, in *vps.Instance) error {
			if sb.State != SandboxActive || in == nil || in.State != vps.StateRunning || sb.Restoring != "" {
				return envelope.Errorf(envelope.CodeFailedPrecondition, "sandbox %s is %s; a snapshot needs it running", sb.ID, stateOf(*sb, in))
			}
			// A sandbox outlives its template: once the template is deleted
			// and its warm pool drained, its row is gone, and the snapshot
			// records no shape (it restores only into this sandbox anyway).
			shape := ""
			t, err := TemplateByID(ctx, tx.Tx, sb.TemplateID)
			switch {
			case err == nil:
				shape = t.Shape
			case !errors.Is(err, store.ErrNotFound):
				return fmt.Errorf("sandbox %s: template: %w", sb.ID, err)
			}
			now := tx.Now()
			snap = Snapshot{ID: envelope.NewID(SnapshotIDPrefix, now), TenantID: sb.TenantID, SandboxID: sb.ID, TemplateID: sb.TemplateID,
				NodeID: in.NodeID, Shape: shape, State: "saving", CreateTime: now, InstanceID: in.ID, Image: in.Image, DiskGiB: in.DiskGiB,
				Keep: msg.GetKeep()}
			if err := SnapshotInsert(ctx, tx.Tx, &snap); err != nil {
				return err
			}
			if _, err := s.inst.SendIn(ctx, tx.Tx, in, vmcmd.KindInstanceSnapshot,
				vmcmd.SnapshotParams{InstanceID: vps.HostID(in.ID), SnapshotID: strings.ReplaceAll(snap.ID, "_", "-")}, snap.ID, now); err != nil {
				return err
			}
			tx.Emit(sandboxEvent("sandbox.snapshot_requested", sb, map[string]any{"snapshot_id": snap.ID, "node_id": snap.NodeID, "keep": snap.Keep}))
			return nil
		})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.SnapshotSandboxResponse{Snapshot: SnapshotProto(snap)}), nil
}

// precondition is a FAILED_PRECONDITION that names the request field it
// is about.
func precondition(field, format string, args ...any) *envelope.Error {
	msg := fmt.Sprintf(format, args...)
	return &envelope.Error{Code: envelope.CodeFailedPrecondition, Message: msg, Violations: []envelope.Violation{{Field: field, Reason: msg}}}
}

// Restore brings a running sandbox back to one of its own ready snapshots,
// in place: the guest's memory holds its address, hostname and host keys,
// so a snapshot can only come back as the instance it was taken of, on
// that host and runtime. The sandbox is restoring until bcd answers
// instance.restore (CommandDone).
func (s *Service) Restore(ctx context.Context, req *connect.Request[apiv1.RestoreSandboxRequest]) (*connect.Response[apiv1.RestoreSandboxResponse], error) {
	msg := req.Msg
	out, err := mutateSandbox(ctx, s, req, msg.GetTenant(), msg.GetSandbox(), func(vs *envelope.Violations) {
		vs.ID("snapshot", msg.GetSnapshot(), SnapshotIDPrefix)
	}, nil, func(ctx context.Context, tx *envelope.Tx, sb *Sandbox, in *vps.Instance) error {
		now := tx.Now()
		// A deleted sandbox's snapshots went with it: say the sandbox is
		// deleted rather than that its snapshot is unknown.
		if sb.State != SandboxActive {
			return precondition("sandbox", "sandbox %s is deleted", sb.ID)
		}
		// The snapshot is looked up in the sandbox's tenant only: another
		// tenant's is not found, whatever its id.
		snap, err := SnapshotGet(ctx, tx.Tx, sb.TenantID, msg.GetSnapshot(), "")
		if errors.Is(err, store.ErrNotFound) {
			return envelope.NotFound("snapshot", msg.GetSnapshot())
		}
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", msg.GetSnapshot(), err)
		}
		switch st := stateOf(*sb, in); {
		case !sb.ExpireTime.After(now):
			return precondition("sandbox", "sandbox %s expired at %s", sb.ID, sb.ExpireTime.UTC().Format(time.RFC3339))
		case st != "running":
			return precondition("sandbox", "sandbox %s is %s; a restore needs it running", sb.ID, st)
		case snap.SandboxID != sb.ID:
			return precondition("snapshot", "snapshot %s is of sandbox %s: a snapshot restores only into the sandbox it was taken of", snap.ID, snap.SandboxID)
		case snap.State != "ready":
			return precondition("snapshot", "snapshot %s is %s; only a ready snapshot restores", snap.ID, snap.State)
		case snap.NodeID != in.NodeID:
			return precondition("snapshot", "snapshot %s is on node %s, the sandbox on %s", snap.ID, snap.NodeID, in.NodeID)
		}
		sb.Restoring, sb.UpdateTime = snap.ID, now
		if err := SandboxSave(ctx, tx.Tx, sb); err != nil {
			return err
		}
		// Each restore is its own command: the same snapshot may be
		// restored again later (even at the same clock reading).
		key := fmt.Sprintf("%s/restore/%s/%s", in.ID, snap.ID, envelope.NewID("rst", now))
		if _, err := s.inst.SendIn(ctx, tx.Tx, in, vmcmd.KindInstanceRestore,
			vmcmd.SnapshotParams{InstanceID: vps.HostID(in.ID), SnapshotID: strings.ReplaceAll(snap.ID, "_", "-")}, key, now); err != nil {
			return err
		}
		tx.Emit(sandboxEvent("sandbox.restore_requested", sb, map[string]any{"snapshot_id": snap.ID, "node_id": snap.NodeID}))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.RestoreSandboxResponse{Sandbox: out}), nil
}

// SnapshotProto converts a snapshot for the API.
func SnapshotProto(s Snapshot) *apiv1.SandboxSnapshot {
	return &apiv1.SandboxSnapshot{Id: s.ID, TenantId: s.TenantID, SandboxId: s.SandboxID, TemplateId: s.TemplateID, NodeId: s.NodeID,
		Shape: s.Shape, State: s.State, CreateTime: timestamppb.New(s.CreateTime), Keep: s.Keep, Image: s.Image, DiskGib: s.DiskGiB}
}

// CommandDone converges from bcd's answers, in the gateway's transaction:
// a claimed warm guest is up once instance.resume succeeds, a snapshot is
// ready (or failed) with instance.snapshot's answer, and a restore ends
// with instance.restore's (whatever it is: a failure is on the instance's
// message and the sandbox's events). Other commands pass by.
func (s *Service) CommandDone(ctx context.Context, tx store.Tx, c fleet.Command, state string) error {
	switch c.Kind {
	case vmcmd.KindInstanceRestore:
		return s.restoreDone(ctx, tx, c, state)
	case vmcmd.KindInstanceResume:
		var ref vmcmd.InstanceRef
		if state != fleet.CommandSucceeded || json.Unmarshal([]byte(c.Params), &ref) != nil || ref.InstanceID == "" {
			return nil //nolint:nilerr // a failed resume leaves the sandbox starting; the instance carries the failure
		}
		_, err := SandboxResumed(ctx, tx, strings.Replace(ref.InstanceID, "-", "_", 1), s.env.Clock().Now())
		return err
	case vmcmd.KindInstanceSnapshot:
	default:
		return nil
	}
	var p vmcmd.SnapshotParams
	if json.Unmarshal([]byte(c.Params), &p) != nil || p.SnapshotID == "" {
		return nil //nolint:nilerr // params that name no snapshot are no snapshot's to converge
	}
	to := "failed"
	if state == fleet.CommandSucceeded {
		to = "ready"
	}
	return SnapshotFinish(ctx, tx, strings.Replace(p.SnapshotID, "-", "_", 1), c.NodeID, to)
}

// CommandsExpired ends the restores whose command's deadline passed
// before their host answered, so the sandbox does not read restoring
// forever.
func (s *Service) CommandsExpired(ctx context.Context, tx store.Tx, expired []fleet.Command) error {
	for _, c := range expired {
		if c.Kind != vmcmd.KindInstanceRestore {
			continue
		}
		if err := s.restoreDone(ctx, tx, c, fleet.CommandExpired); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) restoreDone(ctx context.Context, tx store.Tx, c fleet.Command, state string) error {
	var p vmcmd.SnapshotParams
	if json.Unmarshal([]byte(c.Params), &p) != nil || p.InstanceID == "" || p.SnapshotID == "" {
		return nil //nolint:nilerr // params that name no snapshot are no restore's to converge
	}
	instanceID, snapID := strings.Replace(p.InstanceID, "-", "_", 1), strings.Replace(p.SnapshotID, "-", "_", 1)
	now := s.env.Clock().Now()
	n, err := SandboxRestored(ctx, tx, instanceID, snapID, now)
	if err != nil || n == 0 {
		return err
	}
	sb, err := SandboxByInstance(ctx, tx, instanceID)
	if err != nil {
		return fmt.Errorf("restore of %s: %w", snapID, err)
	}
	typ := "sandbox.restored"
	if state != fleet.CommandSucceeded {
		typ = "sandbox.restore_failed"
	}
	ev := sandboxEvent(typ, &sb, map[string]any{"snapshot_id": snapID, "command_state": state})
	ev.Time = now
	return s.rec.InsertEvents(ctx, tx, []envelope.Event{ev})
}
