package metal

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/images"
	"github.com/better-compute/better-compute/internal/metal/bmc"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Credential limits.
const (
	maxBMCUsername = 64
	maxBMCPassword = 256
	maxSSHKey      = 8 << 10
)

// MachineService serves the MachineService API.
type MachineService struct {
	env *envelope.Envelope
	rt  *Runtime
}

// NewMachineService returns the machine handlers, starting workflows on
// rt's engine.
func NewMachineService(env *envelope.Envelope, rt *Runtime) *MachineService {
	return &MachineService{env: env, rt: rt}
}

var _ apiv1connect.MachineServiceHandler = (*MachineService)(nil)

// MachineResource projects a machine into the authorization model.
func MachineResource(m Machine) iam.Resource {
	return iam.Resource{Type: "Machine", ID: m.ID, TenantID: m.TenantID,
		Attrs: map[string]any{"name": m.Name, "site": m.SiteID, "state": string(m.State)}}
}

// machineRef is a machine resolved for a draft or a read.
type machineRef = ref[Machine]

func lookupMachine(ctx context.Context, q store.Querier, tenantRef, name string) (machineRef, error) {
	return lookupRef(ctx, q, tenantRef, name, "machine", "Machine", MachineGet, MachineResource)
}

// parseMAC checks and normalizes an Ethernet MAC (aa:bb:cc:dd:ee:ff).
func parseMAC(vs *envelope.Violations, field, s string) string {
	if s == "" {
		vs.Add(field, "is required: the MAC address the machine PXE-boots from")
		return ""
	}
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		vs.Add(field, "must be a 48-bit MAC address such as 52:54:00:12:34:56, got %q", truncate(s))
		return ""
	}
	if hw[0]&1 == 1 {
		vs.Add(field, "is a multicast address: a NIC boots from a unicast MAC")
		return ""
	}
	return hw.String()
}

// Enroll adds a machine to a site. The BMC address must fall in one of the
// site's networks, the MAC must not boot another machine, and the password
// is sealed before anything is written.
func (s *MachineService) Enroll(ctx context.Context, req *connect.Request[apiv1.EnrollMachineRequest]) (*connect.Response[apiv1.EnrollMachineResponse], error) {
	msg := req.Msg
	var (
		r    siteRef
		ep   bmc.Endpoint
		addr string
		mac  string
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.EnrollMachineResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("site", msg.GetSite(), SiteIDPrefix)
			vs.Name("name", msg.GetName())
			// The address's syntax is the driver's: checked only for a
			// driver name that can be one.
			validDriver := validBMCDriverName(&vs, "bmc_driver", msg.GetBmcDriver())
			switch {
			case !validDriver:
			case msg.GetBmcAddress() == "":
				vs.Add("bmc_address", "is required")
			default:
				var err error
				if ep, addr, err = parseBMCEndpoint(msg.GetBmcDriver(), msg.GetBmcAddress()); err != nil {
					vs.Add("bmc_address", "%s", strings.TrimPrefix(err.Error(), "bmc: "))
				} else if _, err := netip.ParseAddr(ep.Host); err != nil {
					vs.Add("bmc_address", "must name the BMC by IP address, got host %q: a name cannot be checked against the site's networks", truncate(ep.Host))
				}
			}
			switch u := msg.GetBmcUsername(); {
			case u == "":
				vs.Add("bmc_username", "is required")
			case len(u) > maxBMCUsername:
				vs.Add("bmc_username", "must be at most %d bytes", maxBMCUsername)
			case strings.ContainsAny(u, ":"):
				vs.Add("bmc_username", "must not contain ':'")
			}
			switch p := msg.GetBmcPassword(); {
			case p == "":
				vs.Add("bmc_password", "is required")
			case len(p) > maxBMCPassword:
				vs.Add("bmc_password", "must be at most %d bytes", maxBMCPassword)
			}
			mac = parseMAC(&vs, "mac", msg.GetMac())
			vs.MaxLen("hardware_profile", msg.GetHardwareProfile(), maxHardwareProfile)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if r, err = lookupSite(ctx, q, msg.GetTenant(), msg.GetSite()); err != nil || !r.Found {
				return iam.Resource{Type: "Machine", ID: iam.DraftID}, err
			}
			return iam.Resource{Type: "Machine", ID: iam.DraftID, TenantID: r.ID(), Attrs: map[string]any{"name": msg.GetName()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.EnrollMachineResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			site, err := SiteGet(ctx, tx, r.obj.TenantID, r.obj.ID, store.ForUpdate(tx))
			if errors.Is(err, store.ErrNotFound) {
				return nil, envelope.NotFound("site", msg.GetSite())
			}
			if err != nil {
				return nil, err
			}
			if !inNetworks(ep.Host, site.Networks) {
				return nil, envelope.Invalid(envelope.Violation{Field: "bmc_address",
					Reason: fmt.Sprintf("%s is outside site %s's provisioning networks %v", ep.Host, site.Name, site.Networks)})
			}
			if err := checkSiteDriver(ctx, tx, site, msg.GetBmcDriver()); err != nil {
				return nil, err
			}
			if err := checkHardwareProfile(ctx, tx, site, site.TenantID, msg.GetHardwareProfile(), msg.GetBmcDriver()); err != nil {
				return nil, err
			}
			if inUse, err := MachineMACInUse(ctx, tx, mac); err != nil {
				return nil, err
			} else if inUse {
				return nil, macInUse(mac)
			}
			if s.rt == nil || s.rt.sealer == nil {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
					"BMC credentials cannot be sealed: the control plane runs without BETTER_COMPUTE_SECRET")
			}
			now := tx.Now()
			m := Machine{ID: envelope.NewID(MachineIDPrefix, now), TenantID: site.TenantID, SiteID: site.ID, Name: msg.GetName(),
				BMCDriver: msg.GetBmcDriver(), BMCAddress: addr, BMCHost: ep.Host, BMCUsername: msg.GetBmcUsername(),
				BMCCredentialRef: envelope.NewID(CredentialIDPrefix, now), MAC: mac, HardwareProfile: msg.GetHardwareProfile(),
				State: StateEnrolled, CreateTime: now, UpdateTime: now}
			if m.BMCCredential, err = s.rt.sealer.Seal(sealRef(m.BMCCredentialRef), []byte(msg.GetBmcPassword())); err != nil {
				return nil, fmt.Errorf("seal the BMC credential: %w", err)
			}
			if err := MachineInsert(ctx, tx, &m); err != nil {
				if errors.Is(err, store.ErrUnique) {
					// A concurrent enrolment won the race for the name,
					// the MAC or the BMC.
					return nil, envelope.Errorf(envelope.CodeAlreadyExists,
						"a machine named %q, one booting from MAC %s or one behind BMC %s is already enrolled", m.Name, mac, m.BMCAddress)
				}
				return nil, err
			}
			if s.rt.Sites != nil {
				// The site's lease holder learns the machine at once: a
				// machine enrolled after its driver was reported is
				// driven without waiting for the next list.
				if err := s.rt.Sites.pushIfLeased(ctx, tx, site.ID); err != nil {
					return nil, err
				}
			}
			tx.SetResource(m.ID, m.TenantID)
			tx.Emit(envelope.Event{Type: "machine.enrolled", TenantID: m.TenantID, ResourceType: "Machine", ResourceID: m.ID,
				Data: map[string]any{"name": m.Name, "site_id": m.SiteID, "bmc_driver": m.BMCDriver, "bmc_address": m.BMCAddress, "mac": m.MAC}})
			return &apiv1.EnrollMachineResponse{Machine: MachineProto(m)}, nil
		},
	})
}

func macInUse(mac string) error {
	return &envelope.Error{Code: envelope.CodeAlreadyExists, Message: fmt.Sprintf("MAC %s already boots an enrolled machine", mac),
		Violations: []envelope.Violation{{Field: "mac", Reason: fmt.Sprintf("%s is already enrolled (retire that machine first)", mac)}}}
}

// Get reads a machine.
func (s *MachineService) Get(ctx context.Context, req *connect.Request[apiv1.GetMachineRequest]) (*connect.Response[apiv1.GetMachineResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	vs.Ref("machine", msg.GetMachine(), MachineIDPrefix)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var r machineRef
	if err := s.env.Resolve(ctx, "machine", func(ctx context.Context, q store.Querier) (err error) {
		r, err = lookupMachine(ctx, q, msg.GetTenant(), msg.GetMachine())
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
	return connect.NewResponse(&apiv1.GetMachineResponse{Machine: MachineProto(r.obj)}), nil
}

// List lists a tenant's machines, by site and state.
func (s *MachineService) List(ctx context.Context, req *connect.Request[apiv1.ListMachinesRequest]) (*connect.Response[apiv1.ListMachinesResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	if msg.GetSite() != "" {
		vs.Ref("site", msg.GetSite(), SiteIDPrefix)
	}
	if st := msg.GetState(); st != "" && !slices.Contains(States(), State(st)) {
		vs.Add("state", "must be one of %v, got %q", States(), truncate(st))
	}
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := msg.GetTenant() + "|" + msg.GetSite() + "|" + msg.GetState()
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var r siteRef
	if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		if msg.GetSite() != "" {
			r, err = lookupSite(ctx, q, msg.GetTenant(), msg.GetSite())
			return err
		}
		r.scope, err = tenancy.LookupScope(ctx, q, msg.GetTenant())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.Resource()); err != nil {
		return nil, err
	}
	if err := r.NotFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if msg.GetSite() != "" && !r.found {
		return nil, s.env.Fail(ctx, envelope.NotFound("site", msg.GetSite()))
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var ms []Machine
	if err := s.env.Resolve(ctx, "machines", func(ctx context.Context, q store.Querier) (err error) {
		ms, err = MachineList(ctx, q, MachineListParams{TenantID: r.ID(), SiteID: r.obj.ID, State: msg.GetState(), After: after, Limit: limit + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListMachinesResponse{}
	for n, m := range ms {
		if n == limit {
			out.NextPageToken = envelope.EncodePageToken(ms[n-1].ID, filter)
			break
		}
		out.Machines = append(out.Machines, MachineProto(m))
	}
	return connect.NewResponse(out), nil
}

// prepareFunc checks the machine under its row lock and returns the
// workflow's input; it may change the machine (the image to deploy).
type prepareFunc func(ctx context.Context, tx *envelope.Tx, m *Machine) (map[string]any, error)

// start runs one lifecycle transition through the envelope: the machine is
// locked, must be idle and in a state the operation starts from, and the
// workflow starts in the same transaction as the machine's new state.
func start[Req, Res any](ctx context.Context, s *MachineService, req *connect.Request[Req], tenant, machine, op string,
	validate func(vs *envelope.Violations), prepare prepareFunc, wrap func(*apiv1.Machine) *Res) (*connect.Response[Res], error) {
	var r machineRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[Res]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, tenant)
			vs.Ref("machine", machine, MachineIDPrefix)
			if validate != nil {
				validate(&vs)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupMachine(ctx, q, tenant, machine)
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*Res, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			m, err := lockMachine(ctx, tx, r)
			if err != nil {
				return nil, err
			}
			if err := idle(m, op); err != nil {
				return nil, err
			}
			if err := inMaintenance(m, op); err != nil {
				return nil, err
			}
			t := transitions[op]
			if !slices.Contains(t.from, m.State) {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "machine %s is %s: %s starts from %s", m.Name, m.State, op, stateList(t.from))
			}
			input := map[string]any{}
			if prepare != nil {
				if input, err = prepare(ctx, tx, &m); err != nil {
					return nil, err
				}
			}
			custom, err := tenantProfile(ctx, tx, m, op, input)
			if err != nil {
				return nil, err
			}
			w, err := s.rt.Engine.StartTx(ctx, tx.Tx, provision.StartParams{
				// The engine needs a tenant; the platform's machines run
				// under its name.
				TenantID: cmp.Or(m.TenantID, "platform"), TargetID: m.ID, Profile: op, Custom: custom, Input: input,
				CreatedBy: tx.Caller().Principal.ID,
			})
			if err != nil {
				return nil, err
			}
			from, typ := m.State, "machine."+string(t.running)
			if t.running == "" {
				// A power action or a rotation: the machine keeps its state.
				typ = "machine.power_requested"
				if op == OpRotateBMC {
					typ = "machine.bmc_rotation_requested"
				}
			} else {
				m.State = t.running
			}
			m.WorkflowID, m.Operation, m.UpdateTime = w.ID, op, tx.Now()
			if err := MachineUpdate(ctx, tx, &m); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: typ, TenantID: m.TenantID, ResourceType: "Machine", ResourceID: m.ID,
				Data: map[string]any{"state": string(m.State), "from": string(from), "operation": op, "workflow_id": w.ID}})
			return wrap(MachineProto(m)), nil
		},
	})
}

func lockMachine(ctx context.Context, tx *envelope.Tx, r machineRef) (Machine, error) {
	m, err := MachineGet(ctx, tx, r.obj.TenantID, r.obj.ID, store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) {
		return m, envelope.NotFound("machine", r.name)
	}
	return m, err
}

// idle refuses a machine that runs a workflow: one at a time. A machine
// under a lease runs nothing but the lease's own workflows: its disk and
// its BMC are the lessee's until the teardown gave them back.
func idle(m Machine, op string) error {
	if m.LeaseID != "" && !leaseOp(op) && m.WorkflowID == "" {
		return &envelope.Error{Code: envelope.CodeFailedPrecondition,
			Message:    fmt.Sprintf("machine %s is under lease %s: only its release (machines lease-release) runs on it before %s", m.Name, m.LeaseID, op),
			Violations: []envelope.Violation{{Field: "machine", Reason: "under lease " + m.LeaseID}}}
	}
	if m.WorkflowID == "" {
		return nil
	}
	return &envelope.Error{Code: envelope.CodeFailedPrecondition,
		Message: fmt.Sprintf("machine %s is %s: workflow %s (%s) is active; wait for it to end or cancel it before %s",
			m.Name, m.State, m.WorkflowID, m.Operation, op),
		Err: provision.ErrTargetBusy}
}

func stateList(ss []State) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return strings.Join(out, ", ")
}

// Inspect refreshes a machine's inventory from the ramdisk.
func (s *MachineService) Inspect(ctx context.Context, req *connect.Request[apiv1.InspectMachineRequest]) (*connect.Response[apiv1.InspectMachineResponse], error) {
	return start(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetMachine(), OpInspect, nil, nil, func(m *apiv1.Machine) *apiv1.InspectMachineResponse {
		return &apiv1.InspectMachineResponse{Machine: m}
	})
}

// Commission inventories and wipes a machine (and burns it in when asked);
// it ends ready.
func (s *MachineService) Commission(ctx context.Context, req *connect.Request[apiv1.CommissionMachineRequest]) (*connect.Response[apiv1.CommissionMachineResponse], error) {
	burnIn := req.Msg.GetBurnIn()
	return start(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetMachine(), OpCommission, nil,
		func(ctx context.Context, tx *envelope.Tx, m *Machine) (map[string]any, error) {
			site, err := SiteGet(ctx, tx, m.TenantID, m.SiteID, "")
			if err != nil {
				return nil, err
			}
			// The site may have lost the driver the machine's hardware
			// profile needs since it was enrolled.
			if err := checkHardwareProfile(ctx, tx, site, m.TenantID, m.HardwareProfile, m.BMCDriver); err != nil {
				return nil, err
			}
			return map[string]any{"burn_in": burnIn}, nil
		},
		func(m *apiv1.Machine) *apiv1.CommissionMachineResponse {
			return &apiv1.CommissionMachineResponse{Machine: m}
		})
}

// Deploy writes a signed image to a ready machine and boots it. The image
// must be signed by a key on the machine's tenant's or the platform's
// signer allowlist (images.Verify); the image is pinned (image_refs) until
// the machine is released.
func (s *MachineService) Deploy(ctx context.Context, req *connect.Request[apiv1.DeployMachineRequest]) (*connect.Response[apiv1.DeployMachineResponse], error) {
	image, profile := req.Msg.GetImage(), req.Msg.GetProfile()
	return start(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetMachine(), OpDeploy,
		func(vs *envelope.Violations) {
			vs.Ref("image", image, images.IDPrefix)
			vs.OptionalName("profile", profile)
		},
		func(ctx context.Context, tx *envelope.Tx, m *Machine) (map[string]any, error) {
			if profile != "" {
				// The profile first: a stranger's profile name is not
				// found, whatever the image.
				if _, err := deployProfile(ctx, tx, m.TenantID, profile, OpDeploy); err != nil {
					return nil, err
				}
			}
			input, err := deployImage(ctx, tx, m, m.TenantID, image)
			if err == nil && profile != "" {
				input[inputProfile] = profile
			}
			return input, err
		},
		func(m *apiv1.Machine) *apiv1.DeployMachineResponse { return &apiv1.DeployMachineResponse{Machine: m} })
}

// deployImage checks the image a deploy writes, signed by a key on
// imageTenant's or the platform's allowlist (images.Verify), pins it to m
// (image_refs) and returns the workflow input the ramdisk needs.
func deployImage(ctx context.Context, tx *envelope.Tx, m *Machine, imageTenant, image string) (map[string]any, error) {
	d, err := images.Verify(ctx, tx, imageTenant, image)
	if err != nil {
		var apiErr *envelope.Error
		if errors.As(err, &apiErr) && apiErr.Code == envelope.CodeImageUntrusted {
			apiErr.Violations = append(apiErr.Violations, envelope.Violation{Field: "image", Reason: apiErr.Message})
		}
		return nil, err
	}
	if d.Image.Kind != "raw" && d.Image.Kind != "qcow2" {
		return nil, envelope.Invalid(envelope.Violation{Field: "image",
			Reason: fmt.Sprintf("image %q is a %s: a machine deploys a raw or qcow2 disk image", d.Image.Name, d.Image.Kind)})
	}
	if m.ImageID != "" {
		if _, err := images.RefDelete(ctx, tx, m.ImageID, "machine", m.ID); err != nil {
			return nil, err
		}
	}
	if err := images.RefInsert(ctx, tx, &images.Ref{ImageID: d.Image.ID, Kind: "machine", RefID: m.ID, TenantID: imageTenant,
		CreateTime: tx.Now()}); err != nil {
		return nil, err
	}
	m.ImageID, m.ImageName = d.Image.ID, d.Image.Name
	// What the ramdisk checks before it writes a byte
	// (imagesig.CopyVerified): the digest, the size, the signatures that
	// earned the trust and the keys that made them.
	sigs := make([]any, 0, len(d.Descriptor.Signatures))
	for _, sg := range d.Descriptor.Signatures {
		sigs = append(sigs, map[string]any{"key_fingerprint": sg.KeyFingerprint, "signature": base64.StdEncoding.EncodeToString(sg.Signature)})
	}
	desc := map[string]any{"name": d.Descriptor.Name, "kind": d.Descriptor.Kind, "sha256": d.Descriptor.SHA256,
		"size_bytes": d.Descriptor.Size, "signatures": sigs}
	keys := make([]string, 0, len(d.Trusted))
	for _, k := range d.Trusted {
		keys = append(keys, k.PEM())
	}
	return map[string]any{"image_id": d.Image.ID, "image": desc, "trusted_keys": keys}, nil
}

func toMap(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	return out, json.Unmarshal(b, &out)
}

// Release wipes a machine; it ends ready.
func (s *MachineService) Release(ctx context.Context, req *connect.Request[apiv1.ReleaseMachineRequest]) (*connect.Response[apiv1.ReleaseMachineResponse], error) {
	return start(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetMachine(), OpRelease, nil, nil, func(m *apiv1.Machine) *apiv1.ReleaseMachineResponse {
		return &apiv1.ReleaseMachineResponse{Machine: m}
	})
}

// Rescue boots the ramdisk with an SSH key, for at most an hour.
func (s *MachineService) Rescue(ctx context.Context, req *connect.Request[apiv1.RescueMachineRequest]) (*connect.Response[apiv1.RescueMachineResponse], error) {
	msg := req.Msg
	// The bound is checked on the seconds, before they become a Duration:
	// a huge count would overflow into a small or negative one.
	secs := msg.GetDurationSeconds()
	dur := MaxRescue
	if secs > 0 && secs <= int64(MaxRescue/time.Second) {
		dur = time.Duration(secs) * time.Second
	}
	return start(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetMachine(), OpRescue,
		func(vs *envelope.Violations) {
			switch k := msg.GetSshPublicKey(); {
			case k == "":
				vs.Add("ssh_public_key", "is required: an OpenSSH public key line")
			case len(k) > maxSSHKey:
				vs.Add("ssh_public_key", "must be at most %d bytes", maxSSHKey)
			default:
				if err := checkSSHKey(k); err != nil {
					vs.Add("ssh_public_key", "must be an OpenSSH public key line (ssh-ed25519 AAAA…): %v", err)
				}
			}
			if secs < 0 || secs > int64(MaxRescue/time.Second) {
				vs.Add("duration_seconds", "must be between 1 and %d, got %d", int(MaxRescue/time.Second), secs)
			}
		},
		func(context.Context, *envelope.Tx, *Machine) (map[string]any, error) {
			return map[string]any{"ssh_public_key": strings.TrimSpace(msg.GetSshPublicKey()), "duration_seconds": int64(dur / time.Second)}, nil
		},
		func(m *apiv1.Machine) *apiv1.RescueMachineResponse { return &apiv1.RescueMachineResponse{Machine: m} })
}

// Retire takes an idle machine out of service for good: it keeps its row
// (and history) but frees its MAC and BMC for another enrolment.
func (s *MachineService) Retire(ctx context.Context, req *connect.Request[apiv1.RetireMachineRequest]) (*connect.Response[apiv1.RetireMachineResponse], error) {
	msg := req.Msg
	var r machineRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.RetireMachineResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("machine", msg.GetMachine(), MachineIDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupMachine(ctx, q, msg.GetTenant(), msg.GetMachine())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.RetireMachineResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			m, err := lockMachine(ctx, tx, r)
			if err != nil {
				return nil, err
			}
			if err := idle(m, "retire"); err != nil {
				return nil, err
			}
			if !slices.Contains(retireFrom, m.State) {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "machine %s is %s: retire starts from %s (release a deployed machine first)",
					m.Name, m.State, stateList(retireFrom))
			}
			if m.ImageID != "" {
				if _, err := images.RefDelete(ctx, tx, m.ImageID, "machine", m.ID); err != nil {
					return nil, err
				}
				m.ImageID, m.ImageName = "", ""
			}
			from := m.State
			m.State, m.UpdateTime = StateRetired, tx.Now()
			if err := MachineUpdate(ctx, tx, &m); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "machine.retired", TenantID: m.TenantID, ResourceType: "Machine", ResourceID: m.ID,
				Data: map[string]any{"state": string(m.State), "from": string(from)}})
			return &apiv1.RetireMachineResponse{Machine: MachineProto(m)}, nil
		},
	})
}

// MachineProto converts a machine for the API; the sealed credential never
// leaves.
func MachineProto(m Machine) *apiv1.Machine {
	p := &apiv1.Machine{Id: m.ID, TenantId: m.TenantID, SiteId: m.SiteID, Name: m.Name, BmcDriver: m.BMCDriver,
		BmcAddress: m.BMCAddress, BmcUsername: m.BMCUsername, BmcCredentialRef: m.BMCCredentialRef, Mac: m.MAC,
		HardwareProfile: m.HardwareProfile, State: string(m.State), WorkflowId: m.WorkflowID, Operation: m.Operation,
		ImageId: m.ImageID, ImageName: m.ImageName, FailedOperation: m.FailedOperation, FailedStep: m.FailedStep,
		FailureReason: m.FailureReason, FailureLogs: m.FailureLogs, BmcPendingCredentialRef: m.BMCPendingRef,
		MaintenanceReason: m.MaintenanceReason, LeaseId: m.LeaseID, CreateTime: timestamppb.New(m.CreateTime), UpdateTime: timestamppb.New(m.UpdateTime)}
	if len(m.Inventory) > 0 {
		p.Inventory, _ = structpb.NewStruct(jsonSafe(m.Inventory))
	}
	if len(m.EraseRecord) > 0 {
		p.EraseRecord, _ = structpb.NewStruct(jsonSafe(m.EraseRecord))
	}
	if m.RescueExpireTime != nil {
		p.RescueExpireTime = timestamppb.New(*m.RescueExpireTime)
	}
	if m.MaintenanceTime != nil {
		p.MaintenanceTime = timestamppb.New(*m.MaintenanceTime)
	}
	return p
}

// jsonSafe round-trips a map through JSON so structpb takes every value.
func jsonSafe(in map[string]any) map[string]any {
	out, err := toMap(in)
	if err != nil {
		return map[string]any{}
	}
	return out
}

// sshKeyTypes are the public key types a rescue accepts.
var sshKeyTypes = []string{"ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa",
	"sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"}

// checkSSHKey checks an authorized_keys line: a known type, then base64 of
// an SSH wire key whose first field names the same type.
func checkSSHKey(line string) error {
	f := strings.Fields(line)
	if len(f) < 2 {
		return errors.New("want \"<type> <base64> [comment]\"")
	}
	if strings.ContainsAny(line, "\n\r") {
		return errors.New("one line only")
	}
	if !slices.Contains(sshKeyTypes, f[0]) {
		return fmt.Errorf("unknown key type %q", truncate(f[0]))
	}
	blob, err := base64.StdEncoding.DecodeString(f[1])
	if err != nil {
		return errors.New("the key is not base64")
	}
	if len(blob) < 4 {
		return errors.New("the key is truncated")
	}
	n := binary.BigEndian.Uint32(blob)
	if uint64(n) > uint64(len(blob)-4) || string(blob[4:4+n]) != f[0] {
		return fmt.Errorf("the key's blob is not a %s key", f[0])
	}
	return nil
}
