package vps

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/crypto/ssh"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
	"github.com/better-compute/better-compute/internal/tunnel"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// Instance limits.
const (
	MaxSSHKeys         = 32
	maxSSHKeyLen       = 16 << 10
	MaxUserDataBytes   = 64 << 10
	MaxVolumesAtCreate = 8
	MaxVolumeGiB       = 16 << 10
	maxImageLen        = 128
	// GuestUser is the login account cloud-init creates in the guest.
	GuestUser = "bc"
	// CommandTTL bounds an instance command on its host: a create pulls
	// no image (the host has it) but may boot under TCG.
	CommandTTL = 10 * time.Minute
)

// DefaultGuestImages are the guest images the control plane knows when it
// is given none: the name `make guest-image` installs on hosts.
var DefaultGuestImages = []string{"debian-12"}

// Condition types of an instance.
const (
	CondPlacementDegraded = "PlacementDegraded"
	CondNodeLost          = "NodeLost"
)

// InstanceService serves InstanceService and VolumeService, and converges
// instances and volumes from what bcd reports (CommandDone, NodesLost).
type InstanceService struct {
	env    *envelope.Envelope
	engine *reservation.Engine
	events reservation.EventSource
	rec    envelope.Recorder
	images []string
	poll   time.Duration
	// sealer seals user data, the seed's secrets and the SSH CA's key at
	// rest; nil refuses user data and SSH (guests get only the users'
	// keys).
	sealer Sealer
	// owner, when set, names the module that drives an instance (a
	// sandbox), whose item methods then refuse it (SetOwner).
	owner func(ctx context.Context, q store.Querier, instanceID string) (string, error)
	ca    sshCA
	// tunnels holds SSH tickets and pending tunnels on this replica.
	tunnels *tunnel.Hub
	// peers bridges tunnels through the replica holding a node's session.
	peers TunnelPeers
	// providers runs the instances of provider pools (SetProviders).
	providers ProviderInstances
	// recreateQueue queues a lost instance's recreate in the transaction
	// that lost its host (SetRecreateQueue).
	recreateQueue func(ctx context.Context, tx store.Tx, instanceID string) error
}

var (
	_ apiv1connect.InstanceServiceHandler = (*InstanceService)(nil)
	_ apiv1connect.VolumeServiceHandler   = (*VolumeService)(nil)
)

// InstanceConfig wires the instance service.
type InstanceConfig struct {
	Env *envelope.Envelope
	// Engine books instances' reservations and sends their commands
	// through the fleet's command path.
	Engine *reservation.Engine
	// Events is the outbox Watch reads.
	Events reservation.EventSource
	// Recorder writes events in the fleet's transactions (CommandDone,
	// NodesLost).
	Recorder envelope.Recorder
	// GuestImages are the image names hosts hold (bcd --guest-images);
	// empty: DefaultGuestImages.
	GuestImages []string
	// Sealer seals user data (in the instance row), the seed's secrets (in
	// the instance.create command) and the SSH CA's key at rest; without
	// one an instance with user data and SSH tickets are refused
	// (FAILED_PRECONDITION).
	Sealer Sealer
	// Tunnels holds SSH tickets and pending tunnels (nil: ssh is refused).
	Tunnels *tunnel.Hub
	// Peers finds and reaches the replica holding a node's gateway
	// session; nil opens every tunnel on this replica.
	Peers TunnelPeers
}

// NewInstanceService returns the instance handlers.
func NewInstanceService(cfg InstanceConfig) *InstanceService {
	images := cfg.GuestImages
	if len(images) == 0 {
		images = DefaultGuestImages
	}
	return &InstanceService{env: cfg.Env, engine: cfg.Engine, events: cfg.Events, rec: cfg.Recorder, images: images, poll: time.Second,
		sealer: cfg.Sealer, tunnels: cfg.Tunnels, peers: cfg.Peers}
}

// InstanceResource projects an instance into the authorization model.
func InstanceResource(in Instance) iam.Resource {
	return iam.Resource{Type: "Instance", ID: in.ID, TenantID: in.TenantID, ProjectID: in.ProjectID, Attrs: map[string]any{
		"name": in.Name, "state": in.State, "flavor": in.FlavorName, "vcpus": int64(in.VCPUs), "networkPolicy": in.NetworkPolicy}}
}

// HostID is the name an instance or volume has on its host: its id with
// the prefix's underscore made a dash (vmcmd.ValidID).
func HostID(id string) string { return strings.ReplaceAll(id, "_", "-") }

// apiID is the control plane's id of a host id.
func apiID(hostID string) string {
	if p, rest, ok := strings.Cut(hostID, "-"); ok {
		return p + "_" + rest
	}
	return hostID
}

// macOf derives a guest NIC's address from its instance id: a locally
// administered unicast address, the same on every redelivery.
func macOf(id string) string {
	h := sha256.Sum256([]byte(id))
	return fmt.Sprintf("52:54:%02x:%02x:%02x:%02x", h[0], h[1], h[2], h[3])
}

// InstanceProto converts an instance for the API; user data never leaves.
func InstanceProto(in Instance, volumes []string) *apiv1.Instance {
	out := &apiv1.Instance{Id: in.ID, TenantId: in.TenantID, ProjectId: in.ProjectID, Name: in.Name, State: in.State,
		Flavor: in.FlavorName, FlavorId: in.FlavorID, Image: in.Image, IpPool: in.IPPoolName, IpPoolId: in.IPPoolID,
		Address: in.Address, Gateway: in.Gateway, Dns: in.DNS, Mac: in.MAC, NetworkPolicy: in.NetworkPolicy, SshKeys: in.SSHKeys,
		PoolId: in.PoolID, ReservationId: in.ReservationID, NodeId: in.NodeID, NodeName: in.NodeName, Accel: in.Accel,
		SshAddress: in.SSHAddress, Cpuset: in.CPUSet, Message: in.Message, VolumeIds: volumes, OnHostLost: onHostLostOf(in.OnHostLost),
		CreateTime: timestamppb.New(in.CreateTime), UpdateTime: timestamppb.New(in.UpdateTime), ProviderServerId: in.ProviderServerID}
	for _, c := range in.Conditions {
		out.Conditions = append(out.Conditions, &apiv1.InstanceCondition{Type: c.Type, Status: c.Status, Reason: c.Reason,
			Message: c.Message, UpdateTime: timestamppb.New(c.UpdateTime)})
	}
	return out
}

func instanceEvent(typ string, in *Instance, data map[string]any) envelope.Event {
	if data == nil {
		data = map[string]any{}
	}
	data["state"], data["name"] = in.State, in.Name
	if in.NodeID != "" {
		data["node_id"] = in.NodeID
	}
	return envelope.Event{Type: typ, TenantID: in.TenantID, ResourceType: "Instance", ResourceID: in.ID, Data: data}
}

// createTarget is what a create resolves before its decision.
type createTarget struct {
	scope   scope
	flavor  flavorRef
	ipPool  ipPoolRef
	pool    pool.Pool
	poolOK  bool
	project tenancy.Project
	projOK  bool
	poolErr error
	projErr error
	// paused boots the guest paused (a sandbox's warm pool).
	paused bool
	// provider is the pool's provider policy: a provider pool's instance
	// is a server rented through it (createOnProvider).
	provider *apiv1.ProviderPolicy
	// seed, when set, boots the guest from a snapshot's disk, on the node
	// that holds the snapshot (a sandbox made from a snapshot).
	seed *seedSnapshot
}

// seedSnapshot is the snapshot a guest's disk starts from: where it is
// and its ids on that host.
type seedSnapshot struct {
	nodeID string
	ref    vmcmd.SnapshotParams
}

func validPolicy(p string) bool {
	return p == vmcmd.PolicyEgress || p == vmcmd.PolicyPrivate || p == vmcmd.PolicyNone
}

func validateVolumeSpec(vs *envelope.Violations, field, name string, sizeGiB int32, format string) {
	vs.Name(field+".name", name)
	if sizeGiB < 1 || sizeGiB > MaxVolumeGiB {
		vs.Add(field+".size_gib", "must be between 1 and %d GiB, got %d", MaxVolumeGiB, sizeGiB)
	}
	if format != "" && format != "qcow2" && format != "raw" {
		vs.Add(field+".format", "must be qcow2 or raw, got %q", truncate(format))
	}
}

func validateCreateInstance(vs *envelope.Violations, msg *apiv1.CreateInstanceRequest) {
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	vs.Name("name", msg.GetName())
	// A provider pool's instances take its server type: the flavor is
	// required of the others once the pool is known (checkCreate).
	if msg.GetFlavor() != "" {
		vs.Ref("flavor", msg.GetFlavor(), FlavorIDPrefix)
	}
	if msg.GetIpPool() != "" {
		vs.Ref("ip_pool", msg.GetIpPool(), IPPoolIDPrefix)
	}
	if msg.GetPool() != "" {
		pool.ValidateVisibleRef(vs, "pool", msg.GetPool())
	}
	if msg.GetProject() != "" {
		vs.Ref("project", msg.GetProject(), "prj")
	}
	switch img := msg.GetImage(); {
	case img == "":
		// The control plane's only guest image, if it knows one (Apply).
	case !imageNameRE(img):
		vs.Add("image", "must be a guest image name such as debian-12, got %q", truncate(img))
	}
	if p := msg.GetNetworkPolicy(); p != "" && !validPolicy(p) {
		vs.Add("network_policy", "must be egress, private or none, got %q", truncate(p))
	}
	if n := len(msg.GetSshKeys()); n > MaxSSHKeys {
		vs.Add("ssh_keys", "at most %d keys, got %d", MaxSSHKeys, n)
	}
	for i, k := range msg.GetSshKeys() {
		field := fmt.Sprintf("ssh_keys[%d]", i)
		if len(k) > maxSSHKeyLen {
			vs.Add(field, "is longer than %d bytes", maxSSHKeyLen)
			continue
		}
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
			vs.Add(field, "is not an OpenSSH public key (ssh-ed25519 AAAA…): %v", err)
		}
	}
	if n := len(msg.GetUserData()); n > MaxUserDataBytes {
		vs.Add("user_data", "at most %d bytes, got %d", MaxUserDataBytes, n)
	}
	if n := len(msg.GetVolumes()); n > MaxVolumesAtCreate {
		vs.Add("volumes", "at most %d volumes, got %d", MaxVolumesAtCreate, n)
	}
	validateOnHostLost(vs, msg.GetOnHostLost())
	seen := map[string]bool{}
	for i, v := range msg.GetVolumes() {
		field := fmt.Sprintf("volumes[%d]", i)
		validateVolumeSpec(vs, field, v.GetName(), v.GetSizeGib(), v.GetFormat())
		if seen[v.GetName()] {
			vs.Add(field+".name", "%q is named twice", v.GetName())
		}
		seen[v.GetName()] = true
	}
}

// imageNameRE accepts image names with dots and underscores too
// (ubuntu-24.04, debian_12).
func imageNameRE(s string) bool {
	if s == "" || len(s) > maxImageLen {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
		case i > 0 && (r == '-' || r == '.' || r == '_'):
		default:
			return false
		}
	}
	return true
}

// Create places an instance and asks its host to boot it.
func (s *InstanceService) Create(ctx context.Context, req *connect.Request[apiv1.CreateInstanceRequest]) (*connect.Response[apiv1.CreateInstanceResponse], error) {
	msg := req.Msg
	if url, err := s.ownerURL(ctx, func(ctx context.Context, q store.Querier) (string, error) {
		sc, err := tenancy.LookupScope(ctx, q, msg.GetTenant())
		if err != nil || !sc.Found || sc.Platform {
			return "", err
		}
		p, found, err := reservation.ResolveInstancePool(ctx, q, sc.ID(), msg.GetPool())
		if err != nil || !found || pool.Provider(p) != nil {
			// The create itself answers a pool it cannot resolve; a
			// provider pool has no placer to own it.
			return "", nil //nolint:nilerr
		}
		return p.ID, nil
	}); err != nil || url != "" {
		if err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		return reservation.Forward[apiv1.CreateInstanceRequest, apiv1.CreateInstanceResponse](ctx, s.engine, url,
			apiv1connect.InstanceServiceCreateProcedure, req)
	}
	var t createTarget
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateInstanceResponse]{
		// A refusal past the decision (no capacity, an exhausted pool, an
		// unknown image) stays on record.
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			validateCreateInstance(&vs, msg)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if t.scope, err = tenancy.LookupScope(ctx, q, msg.GetTenant()); err != nil || !t.scope.Found {
				return iam.Resource{Type: "Instance", ID: iam.DraftID}, err
			}
			t.pool, t.poolOK, t.poolErr = reservation.ResolveInstancePool(ctx, q, t.scope.ID(), msg.GetPool())
			if t.poolOK {
				t.provider = pool.Provider(t.pool)
			}
			if msg.GetFlavor() != "" {
				if t.flavor, err = lookupFlavor(ctx, q, msg.GetTenant(), msg.GetFlavor(), true); err != nil {
					return iam.Resource{}, err
				}
			}
			switch {
			case t.provider != nil:
				// The provider's server has the provider's addresses.
			case msg.GetIpPool() == "":
				if t.ipPool, err = defaultIPPool(ctx, q, t.scope); err != nil {
					return iam.Resource{}, err
				}
			default:
				if t.ipPool, err = lookupRef(ctx, q, msg.GetTenant(), msg.GetIpPool(), "ip pool", "IPPool", true, IPPoolGet, IPPoolResource); err != nil {
					return iam.Resource{}, err
				}
			}
			if msg.GetProject() != "" {
				t.project, t.projErr = tenancy.ProjectGet(ctx, q, t.scope.ID(), msg.GetProject())
				t.projOK = t.projErr == nil
				if errors.Is(t.projErr, store.ErrNotFound) {
					t.projErr = nil
				}
			}
			attrs := map[string]any{"name": msg.GetName(), "flavor": msg.GetFlavor(), "networkPolicy": policyOf(msg.GetNetworkPolicy())}
			if t.flavor.found {
				attrs["vcpus"] = int64(t.flavor.obj.VCPUs)
			}
			return iam.Resource{Type: "Instance", ID: iam.DraftID, TenantID: t.scope.ID(), ProjectID: t.project.ID, Attrs: attrs}, t.projErr
		},
		Submit: func(ctx context.Context, write func(ctx context.Context, b *envelope.Batch) error) error {
			if !t.poolOK || !t.flavor.found || !t.ipPool.found || t.provider != nil {
				// Nothing to place: Apply answers alone.
				return s.env.CommitAlone(ctx, write)
			}
			return s.engine.SubmitInstance(ctx, t.pool.ID, t.scope.ID(), write)
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateInstanceResponse, error) {
			return s.applyCreate(ctx, tx, msg, &t)
		},
	})
}

// defaultIPPool is the pool an instance leases from when the request names
// none: the tenant's only pool or, when it has none, the platform's only
// one. Not found (for the caller to refuse) otherwise.
func defaultIPPool(ctx context.Context, q store.Querier, sc scope) (ipPoolRef, error) {
	r := ipPoolRef{scope: sc, noun: "ip pool", typ: "IPPool", res: IPPoolResource}
	for _, owner := range []string{sc.ID(), ""} {
		ps, err := IPPoolList(ctx, q, owner, "", 2)
		if err != nil {
			return r, err
		}
		switch len(ps) {
		case 0:
			continue
		case 1:
			r.obj, r.found, r.own = ps[0], true, owner == sc.ID()
		}
		return r, nil
	}
	return r, nil
}

// ownerURL returns the API URL of the replica that places the pool poolOf
// names, or "" when this replica does (always on SQLite) or there is no
// pool (the mutation then answers for itself): a booking runs in its
// pool's placer, which one replica owns.
func (s *InstanceService) ownerURL(ctx context.Context, poolOf func(ctx context.Context, q store.Querier) (string, error)) (string, error) {
	if s.env.DB().PgxPool() == nil {
		return "", nil
	}
	var poolID string
	if err := s.env.DB().Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		poolID, err = poolOf(ctx, tx)
		return err
	}); err != nil && !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	if poolID == "" {
		return "", nil
	}
	_, url, err := s.engine.Claim(ctx, poolID)
	return url, err
}

func policyOf(p string) string {
	if p == "" {
		return vmcmd.PolicyEgress
	}
	return p
}

// applyCreate checks what the draft found, then books, leases and sends,
// in that order: every refusal comes before the first write.
func (s *InstanceService) applyCreate(ctx context.Context, tx *envelope.Tx, msg *apiv1.CreateInstanceRequest, t *createTarget) (*apiv1.CreateInstanceResponse, error) {
	btx := bootTx{Tx: tx.Tx, emit: tx.Emit, now: tx.Now(), by: tx.Caller().Principal.ID}
	if t.provider != nil && t.poolErr == nil {
		if msg.GetOnHostLost() == OnHostLostRecreate {
			return nil, envelope.Invalid(envelope.Violation{Field: "on_host_lost",
				Reason: "a provider pool's instance is a server at the provider, on no fleet host: recreate does not apply"})
		}
		in, err := s.createOnProvider(ctx, btx, msg, t, t.provider)
		if err != nil {
			return nil, err
		}
		tx.SetResource(in.ID, "")
		return &apiv1.CreateInstanceResponse{Instance: InstanceProto(in, nil)}, nil
	}
	in, ids, err := s.boot(ctx, btx, msg, t)
	if err != nil {
		return nil, err
	}
	tx.SetResource(in.ID, "")
	return &apiv1.CreateInstanceResponse{Instance: InstanceProto(in, ids)}, nil
}

// bootTx is what a boot writes with: the envelope's transaction for a
// create, a placer batch's for a sandbox's warm pool.
type bootTx struct {
	store.Tx
	emit func(envelope.Event)
	now  time.Time
	by   string
}

// checkCreate refuses what the draft found wanting and returns the image
// to boot; it writes nothing.
func (s *InstanceService) checkCreate(msg *apiv1.CreateInstanceRequest, t *createTarget) (string, error) {
	if err := t.scope.NotFound(); err != nil {
		return "", err
	}
	if t.scope.Platform {
		return "", envelope.Invalid(envelope.Violation{Field: "tenant", Reason: "instances belong to a tenant: name one"})
	}
	if msg.GetFlavor() != "" {
		if err := t.flavor.notFound(); err != nil {
			return "", err
		}
	}
	if msg.GetIpPool() == "" && !t.ipPool.found {
		return "", envelope.Invalid(envelope.Violation{Field: "ip_pool", Reason: "the tenant sees no IP pool, or several (its own or the platform's): name one"})
	}
	if err := t.ipPool.notFound(); err != nil {
		return "", err
	}
	if msg.GetProject() != "" && !t.projOK {
		return "", envelope.NotFound("project", msg.GetProject())
	}
	if t.poolErr != nil {
		return "", t.poolErr
	}
	if !t.poolOK {
		if msg.GetPool() != "" {
			return "", envelope.NotFound("pool", msg.GetPool())
		}
		return "", envelope.Invalid(envelope.Violation{Field: "pool", Reason: "the tenant sees no pool, or several: name one"})
	}
	if msg.GetFlavor() == "" {
		return "", envelope.Invalid(envelope.Violation{Field: "flavor", Reason: "is required"})
	}
	image := msg.GetImage()
	if image == "" && len(s.images) == 1 {
		image = s.images[0]
	}
	switch {
	case image == "":
		return "", envelope.Invalid(envelope.Violation{Field: "image", Reason: "is required: one of " + strings.Join(s.images, ", ")})
	case !slices.Contains(s.images, image):
		return "", envelope.Invalid(envelope.Violation{Field: "image", Reason: fmt.Sprintf("unknown guest image %q; hosts hold %s",
			truncate(image), strings.Join(s.images, ", "))})
	}
	return image, nil
}

// boot books, leases, records and sends instance.create.
func (s *InstanceService) boot(ctx context.Context, tx bootTx, msg *apiv1.CreateInstanceRequest, t *createTarget) (Instance, []string, error) {
	image, err := s.checkCreate(msg, t)
	if err != nil {
		return Instance{}, nil, err
	}
	f := t.flavor.obj
	now := tx.now
	// The name is checked before anything is booked: a taken name writes
	// nothing.
	if _, err := InstanceGet(ctx, tx, t.scope.ID(), msg.GetName(), ""); err == nil {
		return Instance{}, nil, envelope.Errorf(envelope.CodeAlreadyExists, "an instance named %q already exists in %s", msg.GetName(), t.scope.Name())
	} else if !errors.Is(err, store.ErrNotFound) {
		return Instance{}, nil, err
	}
	for i, v := range msg.GetVolumes() {
		if _, err := VolumeGet(ctx, tx, t.scope.ID(), v.GetName(), ""); err == nil {
			return Instance{}, nil, &envelope.Error{Code: envelope.CodeAlreadyExists, Message: fmt.Sprintf("a volume named %q already exists in %s", v.GetName(), t.scope.Name()),
				Violations: []envelope.Violation{{Field: fmt.Sprintf("volumes[%d].name", i), Reason: "is taken"}}}
		} else if !errors.Is(err, store.ErrNotFound) {
			return Instance{}, nil, err
		}
	}
	id := envelope.NewID(InstanceIDPrefix, now)
	// Sealed before anything is booked: without a sealer the create is
	// refused and writes nothing.
	userData, err := s.sealUserData(id, msg.GetUserData())
	if err != nil {
		return Instance{}, nil, err
	}
	// Capacity: vCPUs and memory in whole GiB (hugepage flavors in 1 GiB
	// hugepages instead), GPUs of the flavor's model. A ballooning flavor
	// in a pool that overcommits memory books its memory divided by the
	// ratio: the host's balloon controller takes the difference back from
	// the guests when the host runs short.
	bookMiB, floorMiB := balloonBooking(f, pool.MemoryOvercommit(t.pool))
	memGiB := int((bookMiB + 1023) / 1024)
	ib := reservation.InstanceBooking{TenantID: t.scope.ID(), ProjectID: t.project.ID, PoolID: t.pool.ID, VCPU: int(f.VCPUs),
		GPUs: int(f.GPUs), Model: f.GPUModel, CreatedBy: tx.by, Flavor: f.Name, Field: "flavor"}
	// private and none place only where bcd enforces them.
	if policyOf(msg.GetNetworkPolicy()) != vmcmd.PolicyEgress {
		ib.Requires = []string{vmcmd.CapNetworkPolicy}
	}
	if f.Hugepages {
		ib.Hugepages1Gi = memGiB
	} else {
		ib.MemoryGiB = memGiB
	}
	if t.seed != nil {
		// The snapshot's files are on one node only.
		ib.NodeID = t.seed.nodeID
	}
	r, evs, err := s.engine.BookInstance(ctx, tx, ib, now)
	if err != nil {
		return Instance{}, nil, err
	}
	mac := macOf(id)
	lease, ipp, err := LeaseAllocate(ctx, tx, now, t.ipPool.obj.ID, id, mac, "ip_pool")
	if err != nil {
		return Instance{}, nil, err
	}
	prefix, err := netip.ParsePrefix(ipp.CIDR)
	if err != nil {
		return Instance{}, nil, fmt.Errorf("ip pool %s: %w", ipp.ID, err)
	}
	in := Instance{ID: id, TenantID: t.scope.ID(), ProjectID: r.ProjectID, Name: msg.GetName(), State: StateBooting,
		FlavorID: f.ID, FlavorName: f.Name, VCPUs: f.VCPUs, MemoryMiB: f.MemoryMiB, DiskGiB: f.DiskGiB, Image: image,
		IPPoolID: ipp.ID, IPPoolName: ipp.Name, Address: lease.Address, PrefixLen: prefix.Bits(), Gateway: ipp.Gateway, DNS: ipp.DNS,
		MAC: mac, NetworkPolicy: policyOf(msg.GetNetworkPolicy()), SSHKeys: msg.GetSshKeys(), UserDataSealed: userData,
		PoolID: r.PoolID, ReservationID: r.ID, NodeID: r.NodeID, NodeName: r.Placement.NodeName, CreatedBy: tx.by,
		OnHostLost: onHostLostOf(msg.GetOnHostLost()), CreateTime: now, UpdateTime: now, BalloonFloorMiB: floorMiB}
	if f.Pinned {
		in.CPUSet = r.Placement.CPUSet
	}
	// A guest trusts the CA (seedSSH) only where there is one to sign its
	// certificates; the row records the principal it was seeded with.
	if s.sealer != nil {
		in.SSHPrincipal = SSHPrincipal(in.ID)
	}
	if err := InstanceInsert(ctx, tx, &in); err != nil {
		if errors.Is(err, store.ErrUnique) {
			return Instance{}, nil, envelope.Errorf(envelope.CodeAlreadyExists, "an instance named %q already exists in %s", in.Name, t.scope.Name())
		}
		return Instance{}, nil, err
	}
	var vols []VolumeRefRow
	for _, v := range msg.GetVolumes() {
		vol := Volume{ID: envelope.NewID(VolumeIDPrefix, now), TenantID: in.TenantID, Name: v.GetName(), SizeGiB: v.GetSizeGib(),
			Format: formatOf(v.GetFormat()), State: VolumeAttached, InstanceID: in.ID, NodeID: in.NodeID, CreateTime: now, UpdateTime: now}
		if err := VolumeInsert(ctx, tx, &vol); err != nil {
			if errors.Is(err, store.ErrUnique) {
				return Instance{}, nil, envelope.Errorf(envelope.CodeAlreadyExists, "a volume named %q already exists in %s", vol.Name, t.scope.Name())
			}
			return Instance{}, nil, err
		}
		vols = append(vols, VolumeRefRow{ID: vol.ID, Format: vol.Format, SizeGiB: vol.SizeGiB})
		tx.emit(envelope.Event{Type: "volume.created", TenantID: vol.TenantID, ResourceType: "Volume", ResourceID: vol.ID,
			Data: map[string]any{"name": vol.Name, "instance_id": in.ID, "size_gib": vol.SizeGiB}})
	}
	cp := createParams(&in, r, vols)
	cp.Seed.UserData = msg.GetUserData()
	cp.Paused = t.paused
	if t.seed != nil {
		ref := t.seed.ref
		cp.FromSnapshot = &ref
	}
	if err := s.seedSSH(ctx, tx, &cp, &in, now); err != nil {
		return Instance{}, nil, err
	}
	if in.NetworkPolicy == vmcmd.PolicyPrivate {
		// What private admits: the tenant's guests on this network now;
		// later changes follow as instance.peers (pushPeers).
		if cp.Network.Peers, err = PeerAddresses(ctx, tx, in.TenantID, in.IPPoolID, in.ID); err != nil {
			return Instance{}, nil, err
		}
	}
	m, err := paramsMap(cp)
	if err != nil {
		return Instance{}, nil, err
	}
	// The seed's secrets sit in the command row sealed; the gateway opens
	// them at delivery (OpenCreateParams).
	if err := s.sealSeed(in.TenantID, m); err != nil {
		return Instance{}, nil, err
	}
	if _, err := s.send(ctx, tx, &in, vmcmd.KindInstanceCreate, m, in.ID+"/create", now); err != nil {
		return Instance{}, nil, err
	}
	for _, ev := range evs {
		tx.emit(ev)
	}
	tx.emit(instanceEvent("instance.created", &in, map[string]any{"flavor": in.FlavorName, "address": in.Address,
		"reservation_id": in.ReservationID}))
	ids := make([]string, len(vols))
	for i, v := range vols {
		ids[i] = v.ID
	}
	return in, ids, nil
}

// VolumeRefRow is a volume as instance.create names it.
type VolumeRefRow struct {
	ID      string
	Format  string
	SizeGiB int32
}

func formatOf(f string) string {
	if f == "" {
		return "qcow2"
	}
	return f
}

// balloonBooking is the memory an instance of f books in a pool that
// overcommits memory by pct percent, and its balloon floor (0: no
// balloon). Only ballooning flavors are overcommitted: the host could take
// nothing back from the others. The floor is the flavor's min_memory_mib,
// else the booked memory: what the host guarantees the guest.
func balloonBooking(f Flavor, pct int) (bookMiB, floorMiB int64) {
	if !f.Balloon {
		return f.MemoryMiB, 0
	}
	bookMiB = (f.MemoryMiB*100 + int64(pct) - 1) / int64(pct)
	floorMiB = cmp.Or(f.MinMemoryMiB, bookMiB)
	if floorMiB >= f.MemoryMiB {
		// Nothing to take back (a pool that does not overcommit).
		floorMiB = 0
	}
	return bookMiB, floorMiB
}

// createParams is instance.create's params: what capacity booked, what
// IPAM leased, and the guest's seed.
func createParams(in *Instance, r *reservation.Reservation, vols []VolumeRefRow) vmcmd.CreateParams {
	p := vmcmd.CreateParams{InstanceID: HostID(in.ID), VCPUs: int(in.VCPUs), MemoryMiB: int(in.MemoryMiB), DiskMiB: int(in.DiskGiB) * 1024,
		Image:           vmcmd.Image{Name: in.Image, Sha256: in.ImageSHA256},
		Network:         vmcmd.Network{MAC: in.MAC, Address: fmt.Sprintf("%s/%d", in.Address, in.PrefixLen), Gateway: in.Gateway, DNS: in.DNS, Policy: in.NetworkPolicy},
		Seed:            vmcmd.Seed{Hostname: in.Name, User: GuestUser, AuthorizedKeys: in.SSHKeys},
		BalloonFloorMiB: int(in.BalloonFloorMiB),
	}
	for _, v := range vols {
		p.Volumes = append(p.Volumes, vmcmd.VolumeRef{VolumeID: HostID(v.ID), Format: v.Format, SizeMiB: int(v.SizeGiB) * 1024})
	}
	if in.CPUSet != "" && r != nil {
		p.Placement.HostCPUs = r.Placement.CPUs
		if r.Placement.NUMA >= 0 {
			numa := r.Placement.NUMA
			p.Placement.NUMANode = &numa
		}
	}
	if r != nil {
		p.Placement.HugePages = r.Hugepages1Gi > 0
		p.Placement.GPUUUIDs = r.Placement.GPUUUIDs
	}
	return p
}

// paramsMap turns a vmcmd params struct into the command's JSON object.
func paramsMap(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m)
}

// send sends an instance command to its host through the fleet's command
// path, in the caller's transaction.
func (s *InstanceService) send(ctx context.Context, tx store.Tx, in *Instance, kind string, params any, key string, now time.Time) (string, error) {
	m, err := paramsMap(params)
	if err != nil {
		return "", err
	}
	id, err := s.engine.Commands.Send(ctx, tx, reservation.Command{TenantID: in.TenantID, NodeID: in.NodeID, Kind: kind, Params: m,
		IdempotencyKey: key, CreatedBy: Principal, TTL: CommandTTL, Time: now})
	if err != nil {
		return "", fmt.Errorf("send %s: %w", kind, err)
	}
	return id, nil
}

// instanceRef is an instance resolved before a decision.
type instanceRef = tenancy.Item[Instance]

var instanceKind = tenancy.ItemKind[Instance]{Type: "Instance", Noun: "instance", Resource: InstanceResource,
	Get: func(ctx context.Context, q store.Querier, tenantID, ref string) (Instance, error) {
		return InstanceGet(ctx, q, tenantID, ref, "")
	}}

func lookupInstance(ctx context.Context, q store.Querier, tenantRef, ref string) (instanceRef, error) {
	return instanceKind.Lookup(ctx, q, tenantRef, ref)
}

func validateInstanceRef(vs *envelope.Violations, tenant, ref string) {
	vs.Ref("tenant", tenant, "tnt")
	vs.Ref("instance", ref, InstanceIDPrefix)
}

// Get reads an instance.
func (s *InstanceService) Get(ctx context.Context, req *connect.Request[apiv1.GetInstanceRequest]) (*connect.Response[apiv1.GetInstanceResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateInstanceRef(&vs, msg.GetTenant(), msg.GetInstance())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		r    instanceRef
		vols []Volume
	)
	if err := s.env.Resolve(ctx, "instance", func(ctx context.Context, q store.Querier) (err error) {
		if r, err = lookupInstance(ctx, q, msg.GetTenant(), msg.GetInstance()); err != nil || !r.Found {
			return err
		}
		vols, err = VolumesOfInstance(ctx, q, r.Obj.ID)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.Resource()); err != nil {
		return nil, err
	}
	if err := r.NotFound(msg.GetInstance()); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := InstanceProto(r.Obj, volumeIDs(vols))
	if err := s.managedBy(ctx, []*apiv1.Instance{out}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetInstanceResponse{Instance: out}), nil
}

// managedBy says, on each instance another module drives, which: a
// listing then explains the instances nobody created by hand.
func (s *InstanceService) managedBy(ctx context.Context, ins []*apiv1.Instance) error {
	if s.owner == nil || len(ins) == 0 {
		return nil
	}
	return s.env.DB().Read(ctx, func(ctx context.Context, tx store.Tx) error {
		for _, in := range ins {
			by, err := s.owner(ctx, tx, in.GetId())
			if err != nil {
				return err
			}
			in.ManagedBy = by
		}
		return nil
	})
}

func volumeIDs(vs []Volume) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.ID)
	}
	return out
}

// List lists a tenant's instances.
func (s *InstanceService) List(ctx context.Context, req *connect.Request[apiv1.ListInstancesRequest]) (*connect.Response[apiv1.ListInstancesResponse], error) {
	ins, next, err := tenancy.ListPage(ctx, s.env, req.Msg, "instances",
		func(ctx context.Context, q store.Querier, sc scope, after string, limit int) ([]Instance, error) {
			return InstanceList(ctx, q, sc.ID(), after, limit)
		}, func(in Instance) string { return in.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListInstancesResponse{NextPageToken: next}
	for _, in := range ins {
		out.Instances = append(out.Instances, InstanceProto(in, nil))
	}
	if err := s.managedBy(ctx, out.Instances); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(out), nil
}

// stateRequired refuses an action in a state it does not apply to.
func stateRequired(in *Instance, action string, states ...string) error {
	if slices.Contains(states, in.State) {
		return nil
	}
	return envelope.Errorf(envelope.CodeFailedPrecondition, "instance %s is %s; %s needs it %s", in.Name, in.State, action,
		strings.Join(states, " or "))
}

// powerAction sends start, stop or reboot; the instance's state follows
// bcd's answer.
func (s *InstanceService) powerAction(kind, event string, states ...string) func(ctx context.Context, tx *envelope.Tx, in *Instance) error {
	return func(ctx context.Context, tx *envelope.Tx, in *Instance) error {
		if err := stateRequired(in, strings.TrimPrefix(kind, "instance."), states...); err != nil {
			return err
		}
		if ok, err := s.onProvider(ctx, tx.Tx, in); err != nil || ok {
			if err != nil {
				return err
			}
			action := map[string]string{vmcmd.KindInstanceStart: "on", vmcmd.KindInstanceStop: "off", vmcmd.KindInstanceReboot: "reboot"}[kind]
			if err := s.providers.PowerTx(ctx, tx.Tx, in, action); err != nil {
				return err
			}
			tx.Emit(instanceEvent(event, in, nil))
			return nil
		}
		now := tx.Now()
		key := fmt.Sprintf("%s/%s/%d", in.ID, strings.TrimPrefix(kind, "instance."), now.UnixNano())
		if _, err := s.send(ctx, tx.Tx, in, kind, vmcmd.InstanceRef{InstanceID: HostID(in.ID)}, key, now); err != nil {
			return err
		}
		tx.Emit(instanceEvent(event, in, nil))
		return nil
	}
}

// Start boots a stopped instance.
func (s *InstanceService) Start(ctx context.Context, req *connect.Request[apiv1.StartInstanceRequest]) (*connect.Response[apiv1.StartInstanceResponse], error) {
	in, vols, err := mutate(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetInstance(), false,
		s.powerAction(vmcmd.KindInstanceStart, "instance.start_requested", StateStopped, StateRunning))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.StartInstanceResponse{Instance: InstanceProto(*in, vols)}), nil
}

// Stop shuts a running instance down; it keeps its host, address and disks.
func (s *InstanceService) Stop(ctx context.Context, req *connect.Request[apiv1.StopInstanceRequest]) (*connect.Response[apiv1.StopInstanceResponse], error) {
	in, vols, err := mutate(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetInstance(), false,
		s.powerAction(vmcmd.KindInstanceStop, "instance.stop_requested", StateRunning, StateStopped))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.StopInstanceResponse{Instance: InstanceProto(*in, vols)}), nil
}

// Reboot restarts a running instance's guest.
func (s *InstanceService) Reboot(ctx context.Context, req *connect.Request[apiv1.RebootInstanceRequest]) (*connect.Response[apiv1.RebootInstanceResponse], error) {
	in, vols, err := mutate(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetInstance(), false,
		s.powerAction(vmcmd.KindInstanceReboot, "instance.reboot_requested", StateRunning))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.RebootInstanceResponse{Instance: InstanceProto(*in, vols)}), nil
}

// Delete removes the guest from its host; the address, booking and the
// instance's row follow once bcd confirms (at once when no host holds it).
func (s *InstanceService) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteInstanceRequest]) (*connect.Response[apiv1.DeleteInstanceResponse], error) {
	if url, err := s.ownerURL(ctx, func(ctx context.Context, q store.Querier) (string, error) {
		r, err := lookupInstance(ctx, q, req.Msg.GetTenant(), req.Msg.GetInstance())
		if r.Obj.ReservationID == "" {
			return "", err // nothing booked (a provider pool's, a failed create): no placer to fence
		}
		return r.Obj.PoolID, err
	}); err != nil || url != "" {
		if err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		return reservation.Forward[apiv1.DeleteInstanceRequest, apiv1.DeleteInstanceResponse](ctx, s.engine, url,
			apiv1connect.InstanceServiceDeleteProcedure, req)
	}
	in, vols, err := mutate(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetInstance(), true,
		func(ctx context.Context, tx *envelope.Tx, in *Instance) error {
			now := tx.Now()
			switch in.State {
			case StateDeleted:
				return nil // deleting twice changes nothing
			case StateLost, StatePlacing:
				// Its host is gone, and the guest with it (or it waits
				// for a new one): nothing to ask.
				return s.finishDelete(ctx, tx.Tx, tx.Emit, in, in.State, "Deleted", now)
			}
			if ok, err := s.onProvider(ctx, tx.Tx, in); err != nil || ok {
				if err != nil || in.State == StateDeleting {
					return err
				}
				from := in.State
				in.State, in.UpdateTime = StateDeleting, now
				if ok, err := InstanceSave(ctx, tx.Tx, in, from); err != nil || !ok {
					return errors.Join(err, errMoved(ok))
				}
				if err := s.providers.DeleteTx(ctx, tx.Tx, in); err != nil {
					return err
				}
				tx.Emit(instanceEvent("instance.deleting", in, nil))
				return nil
			}
			// A failed create may have left part of a guest on its host:
			// the delete goes there too (deleting a missing guest succeeds).
			from := in.State
			in.State, in.UpdateTime = StateDeleting, now
			if ok, err := InstanceSave(ctx, tx.Tx, in, from); err != nil || !ok {
				return errors.Join(err, errMoved(ok))
			}
			key := fmt.Sprintf("%s/delete/%d", in.ID, now.UnixNano())
			if _, err := s.send(ctx, tx.Tx, in, vmcmd.KindInstanceDelete, vmcmd.InstanceRef{InstanceID: HostID(in.ID)}, key, now); err != nil {
				return err
			}
			tx.Emit(instanceEvent("instance.deleting", in, nil))
			return nil
		})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.DeleteInstanceResponse{Instance: InstanceProto(*in, vols)}), nil
}

func errMoved(ok bool) error {
	if ok {
		return nil
	}
	return envelope.Errorf(envelope.CodeConflict, "the instance changed concurrently; retry")
}

// mutate runs an instance mutation under the request's envelope.
func mutate[Req any](ctx context.Context, s *InstanceService, req *connect.Request[Req], tenant, ref string, viaPlacer bool,
	apply func(ctx context.Context, tx *envelope.Tx, in *Instance) error) (*Instance, []string, error) {
	var (
		r    instanceRef
		cur  Instance
		vols []Volume
	)
	mut := envelope.Mutation[apiv1.Instance]{
		Validate: func() error {
			var vs envelope.Violations
			validateInstanceRef(&vs, tenant, ref)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupInstance(ctx, q, tenant, ref)
			return r.Resource(), err
		},
		Submit: func(ctx context.Context, write func(ctx context.Context, b *envelope.Batch) error) error {
			if !viaPlacer || !r.Found || r.Obj.PoolID == "" || r.Obj.ReservationID == "" {
				return s.env.CommitAlone(ctx, write)
			}
			return s.engine.SubmitInstance(ctx, r.Obj.PoolID, r.Obj.TenantID, write)
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.Instance, error) {
			if err := r.NotFound(ref); err != nil {
				return nil, err
			}
			var err error
			cur, err = InstanceByID(ctx, tx.Tx, r.Obj.ID, store.ForUpdate(tx.Tx))
			if err != nil {
				return nil, envelope.FromStore(err, "instance")
			}
			if err := s.checkOwner(ctx, tx.Tx, &cur); err != nil {
				return nil, err
			}
			if err := apply(ctx, tx, &cur); err != nil {
				return nil, err
			}
			if vols, err = VolumesOfInstance(ctx, tx.Tx, cur.ID); err != nil {
				return nil, err
			}
			return InstanceProto(cur, volumeIDs(vols)), nil
		},
	}
	_, err := envelope.Mutate(ctx, s.env, req, mut)
	return &cur, volumeIDs(vols), err
}
