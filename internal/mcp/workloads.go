package mcp

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"connectrpc.com/connect"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/sshexec"
)

// Instance is an instance as the tools show it.
type Instance struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	State      string `json:"state"`
	Flavor     string `json:"flavor,omitempty"`
	Image      string `json:"image,omitempty"`
	Pool       string `json:"pool_id,omitempty"`
	Address    string `json:"address,omitempty"`
	Node       string `json:"node,omitempty"`
	SSHAddress string `json:"ssh_address,omitempty"`
	Message    string `json:"message,omitempty"`
	ManagedBy  string `json:"managed_by,omitempty"`
}

func instanceOf(in *apiv1.Instance) *Instance {
	if in == nil {
		return nil
	}
	return &Instance{ID: in.GetId(), Name: in.GetName(), State: in.GetState(), Flavor: in.GetFlavor(), Image: in.GetImage(),
		Pool: in.GetPoolId(), Address: in.GetAddress(), Node: cmp.Or(in.GetNodeName(), in.GetNodeId()), SSHAddress: in.GetSshAddress(),
		Message: in.GetMessage(), ManagedBy: in.GetManagedBy()}
}

// Sandbox is a sandbox as the tools show it.
type Sandbox struct {
	ID         string `json:"id"`
	Template   string `json:"template"`
	InstanceID string `json:"instance_id,omitempty"`
	State      string `json:"state"`
	Origin     string `json:"origin,omitempty"`
	Address    string `json:"address,omitempty"`
	Expires    string `json:"expires,omitempty"`
}

func sandboxOf(s *apiv1.Sandbox) *Sandbox {
	if s == nil {
		return nil
	}
	return &Sandbox{ID: s.GetId(), Template: cmp.Or(s.GetTemplate(), s.GetTemplateId()), InstanceID: s.GetInstanceId(),
		State: s.GetState(), Origin: s.GetOrigin(), Address: s.GetAddress(), Expires: timeOf(s.GetExpireTime())}
}

// CreateInstanceInput is create_instance's arguments.
type CreateInstanceInput struct {
	Tenant         string   `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Name           string   `json:"name" jsonschema:"the instance's name, unique in the tenant"`
	Flavor         string   `json:"flavor,omitempty" jsonschema:"a flavor of the tenant or the platform (none on a provider pool)"`
	Image          string   `json:"image,omitempty" jsonschema:"the guest image (default: the only one the control plane knows)"`
	Pool           string   `json:"pool,omitempty" jsonschema:"the capacity pool (default: the only one the tenant sees)"`
	IPPool         string   `json:"ip_pool,omitempty" jsonschema:"the IP pool (default: the only one the tenant sees)"`
	SSHKeys        []string `json:"ssh_keys,omitempty" jsonschema:"OpenSSH public keys for the guest's user"`
	Wait           string   `json:"wait,omitempty" jsonschema:"how long to wait for the instance to run, e.g. 2m (default 2m; 0s answers at once)"`
	ConfirmationID string   `json:"confirmation_id,omitempty" jsonschema:"an approved confirmation, when retrying a call that answered CONFIRMATION_REQUIRED"`
}

// InstanceRefInput names one instance.
type InstanceRefInput struct {
	Tenant         string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Instance       string `json:"instance" jsonschema:"the instance's name or id"`
	ConfirmationID string `json:"confirmation_id,omitempty" jsonschema:"an approved confirmation, when retrying a call that answered CONFIRMATION_REQUIRED"`
}

// InstanceOutput is the result of the instance tools.
type InstanceOutput struct {
	Instance *Instance `json:"instance,omitempty"`
	Outcome
}

// CreateSandboxInput is create_sandbox's arguments.
type CreateSandboxInput struct {
	Tenant   string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Template string `json:"template" jsonschema:"a sandbox template of the tenant (name or id)"`
	TTL      string `json:"ttl,omitempty" jsonschema:"lifetime, e.g. 30m (default: the template's)"`
	Wait     string `json:"wait,omitempty" jsonschema:"how long to wait for it to run, e.g. 1m (default 1m; 0s answers at once)"`
}

// SandboxRefInput names one sandbox.
type SandboxRefInput struct {
	Tenant         string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Sandbox        string `json:"sandbox" jsonschema:"the sandbox's id"`
	ConfirmationID string `json:"confirmation_id,omitempty" jsonschema:"an approved confirmation, when retrying a call that answered CONFIRMATION_REQUIRED"`
}

// ExtendSandboxInput is extend_sandbox's arguments.
type ExtendSandboxInput struct {
	Tenant  string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's id"`
	By      string `json:"by" jsonschema:"how much longer, e.g. 30m"`
}

// ExecSandboxInput is exec_sandbox's arguments.
type ExecSandboxInput struct {
	Tenant  string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's id"`
	Command string `json:"command" jsonschema:"a shell command line run by the guest user's shell, e.g. 'uname -a'"`
}

// SandboxOutput is the result of the sandbox tools.
type SandboxOutput struct {
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	Outcome
}

// ExecOutput is exec_sandbox's result: the command's exit status and
// output (each cut at maxExecOutput bytes).
type ExecOutput struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	Outcome
}

// maxExecOutput bounds what exec_sandbox returns of each stream: a model
// reads it whole.
const maxExecOutput = 64 << 10

// waitFor parses a wait argument: def when empty.
func waitFor(field, s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	return parseSpan(field, s)
}

// poll reads get every tick until done says so, d passes, or ctx ends; it
// answers the last value read.
func poll[T any](ctx context.Context, d time.Duration, get func(ctx context.Context) (T, error), done func(T) bool) (T, error) {
	v, err := get(ctx)
	if err != nil || d <= 0 || done(v) {
		return v, err
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-deadline.C:
			return v, nil
		case <-tick.C:
		}
		if v, err = get(ctx); err != nil || done(v) {
			return v, err
		}
	}
}

func (s *Server) addWorkloadTools(srv *sdk.Server) {
	destructive := &sdk.ToolAnnotations{DestructiveHint: ptr(true)}
	addTool(s, srv, &sdk.Tool{Name: "create_instance",
		Description: "Create a virtual machine (an instance) and wait for it to run: on a host of a capacity pool, or as a server rented through a provider pool. Answers the instance; a failed one says why."},
		func(in CreateInstanceInput) string { return in.Tenant }, map[string]string{"Bc-Confirmation-Id": "confirmation_id"},
		func(ctx context.Context, c call, in CreateInstanceInput) (*InstanceOutput, error) {
			wait, err := waitFor("wait", in.Wait, 2*time.Minute)
			if err != nil {
				return nil, err
			}
			res, err := c.api.Instances.Create(ctx, mutation(&apiv1.CreateInstanceRequest{Tenant: c.tenant, Name: in.Name, Flavor: in.Flavor,
				Image: in.Image, Pool: in.Pool, IpPool: in.IPPool, SshKeys: in.SSHKeys}, in.ConfirmationID))
			if err != nil {
				return nil, err
			}
			id := res.Msg.GetInstance().GetId()
			got, err := poll(ctx, wait, func(ctx context.Context) (*apiv1.Instance, error) {
				r, err := c.api.Instances.Get(ctx, connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: c.tenant, Instance: id}))
				return r.Msg.GetInstance(), err
			}, func(in *apiv1.Instance) bool {
				switch in.GetState() {
				case "running", "failed", "lost", "deleted":
					return true
				}
				return false
			})
			if err != nil {
				return nil, err
			}
			return &InstanceOutput{Instance: instanceOf(got)}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "delete_instance", Annotations: destructive,
		Description: "Delete an instance: its guest (or rented server), address and booking go."},
		func(in InstanceRefInput) string { return in.Tenant }, map[string]string{"Bc-Confirmation-Id": "confirmation_id"},
		func(ctx context.Context, c call, in InstanceRefInput) (*InstanceOutput, error) {
			res, err := c.api.Instances.Delete(ctx, mutation(&apiv1.DeleteInstanceRequest{Tenant: c.tenant, Instance: in.Instance}, in.ConfirmationID))
			if err != nil {
				return nil, err
			}
			return &InstanceOutput{Instance: instanceOf(res.Msg.GetInstance())}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "create_sandbox",
		Description: "Create a sandbox from one of the tenant's templates (a warm one when the template keeps some) and wait for it to run."},
		func(in CreateSandboxInput) string { return in.Tenant }, map[string]string{"ttl": "ttl"},
		func(ctx context.Context, c call, in CreateSandboxInput) (*SandboxOutput, error) {
			wait, err := waitFor("wait", in.Wait, time.Minute)
			if err != nil {
				return nil, err
			}
			req := &apiv1.CreateSandboxRequest{Tenant: c.tenant, Template: in.Template}
			if in.TTL != "" {
				d, err := parseSpan("ttl", in.TTL)
				if err != nil {
					return nil, err
				}
				req.Ttl = durationpb.New(d)
			}
			res, err := c.api.Sandboxes.Create(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, err
			}
			id := res.Msg.GetSandbox().GetId()
			got, err := poll(ctx, wait, func(ctx context.Context) (*apiv1.Sandbox, error) {
				r, err := c.api.Sandboxes.Get(ctx, connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: c.tenant, Sandbox: id}))
				return r.Msg.GetSandbox(), err
			}, func(sb *apiv1.Sandbox) bool {
				return sb.GetState() == "running" || sb.GetState() == "failed" || sb.GetState() == "deleted"
			})
			if err != nil {
				return nil, err
			}
			return &SandboxOutput{Sandbox: sandboxOf(got)}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "exec_sandbox",
		Description: "Run a command in a running sandbox (over SSH with a one-use certificate, through the control plane) and answer its exit code, stdout and stderr."},
		func(in ExecSandboxInput) string { return in.Tenant }, map[string]string{"public_key": "sandbox"},
		func(ctx context.Context, c call, in ExecSandboxInput) (*ExecOutput, error) {
			if in.Command == "" {
				return nil, invalid("command", "required, e.g. 'uname -a'")
			}
			url, tlsCfg := s.apiURL()
			if url == "" {
				return nil, &Refusal{Code: "FAILED_PRECONDITION", Message: "this MCP server does not know the API's address, so it cannot open the SSH tunnel exec needs"}
			}
			key, err := sshexec.NewKey()
			if err != nil {
				return nil, err
			}
			res, err := c.api.Sandboxes.Exec(ctx, connect.NewRequest(&apiv1.ExecSandboxRequest{Tenant: c.tenant, Sandbox: in.Sandbox,
				PublicKey: key.AuthorizedKey}))
			if err != nil {
				return nil, err
			}
			var stdout, stderr limitedBuffer
			r, err := sshexec.Run(ctx, sshexec.Params{APIURL: url, TLS: tlsCfg, Ticket: res.Msg.GetTicket(), Key: key,
				Command: in.Command, Stdout: &stdout, Stderr: &stderr})
			if err != nil {
				return nil, fmt.Errorf("exec in sandbox %s: %w", in.Sandbox, err)
			}
			return &ExecOutput{ExitCode: r.ExitCode, Stdout: stdout.String(), Stderr: stderr.String()}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "extend_sandbox",
		Description: "Keep a sandbox longer: its expiry moves by the given duration (within its template's maximum)."},
		func(in ExtendSandboxInput) string { return in.Tenant }, map[string]string{"extend": "by", "ttl": "by"},
		func(ctx context.Context, c call, in ExtendSandboxInput) (*SandboxOutput, error) {
			if in.By == "" {
				return nil, invalid("by", "required, e.g. 30m")
			}
			d, err := parseSpan("by", in.By)
			if err != nil {
				return nil, err
			}
			// The API takes the new lifetime counted from the create.
			cur, err := c.api.Sandboxes.Get(ctx, connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: c.tenant, Sandbox: in.Sandbox}))
			if err != nil {
				return nil, err
			}
			sb := cur.Msg.GetSandbox()
			ttl := sb.GetExpireTime().AsTime().Sub(sb.GetCreateTime().AsTime()) + d
			res, err := c.api.Sandboxes.Extend(ctx, connect.NewRequest(&apiv1.ExtendSandboxRequest{Tenant: c.tenant, Sandbox: in.Sandbox,
				Ttl: durationpb.New(ttl)}))
			if err != nil {
				return nil, err
			}
			return &SandboxOutput{Sandbox: sandboxOf(res.Msg.GetSandbox())}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "delete_sandbox", Annotations: destructive,
		Description: "Delete a sandbox: its guest goes."},
		func(in SandboxRefInput) string { return in.Tenant }, map[string]string{"Bc-Confirmation-Id": "confirmation_id"},
		func(ctx context.Context, c call, in SandboxRefInput) (*SandboxOutput, error) {
			res, err := c.api.Sandboxes.Delete(ctx, mutation(&apiv1.DeleteSandboxRequest{Tenant: c.tenant, Sandbox: in.Sandbox}, in.ConfirmationID))
			if err != nil {
				return nil, err
			}
			return &SandboxOutput{Sandbox: sandboxOf(res.Msg.GetSandbox())}, nil
		})
}

// apiURL is where exec's SSH tunnel dials the API, and with what TLS.
func (s *Server) apiURL() (string, *tls.Config) {
	if s.cfg.APIURL == nil {
		return "", nil
	}
	return s.cfg.APIURL(), s.cfg.TLS
}

// limitedBuffer keeps the first maxExecOutput bytes written to it and
// drops the rest, saying so.
type limitedBuffer struct {
	b   bytes.Buffer
	cut bool
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := maxExecOutput - l.b.Len(); room < len(p) {
		l.cut = true
		if room > 0 {
			l.b.Write(p[:room])
		}
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *limitedBuffer) String() string {
	if l.cut {
		return l.b.String() + "\n[output cut at 64 KiB]"
	}
	return l.b.String()
}
