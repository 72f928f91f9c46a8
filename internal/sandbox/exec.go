package sandbox

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/crypto/ssh"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

// Exec signs the caller's key for the sandbox guest's account, valid at
// most 15 minutes and never past the sandbox's expire time, and issues a
// tunnel ticket: the client then runs its command over SSH through the
// gateway (no agent in the guest).
func (s *Service) Exec(ctx context.Context, req *connect.Request[apiv1.ExecSandboxRequest]) (*connect.Response[apiv1.ExecSandboxResponse], error) {
	msg := req.Msg
	var (
		r     sandboxRef
		pub   ssh.PublicKey
		grant *vps.SSHGrant
	)
	res, err := envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.ExecSandboxResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			validateSandboxRef(&vs, msg.GetTenant(), msg.GetSandbox())
			pub = vps.ParsePublicKey(&vs, "public_key", msg.GetPublicKey())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupSandbox(ctx, q, msg.GetTenant(), msg.GetSandbox())
			return r.Resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.ExecSandboxResponse, error) {
			if err := r.NotFound(msg.GetSandbox()); err != nil {
				return nil, err
			}
			sb, err := SandboxGet(ctx, tx.Tx, r.Obj.TenantID, r.Obj.ID, "")
			if err != nil {
				return nil, envelope.FromStore(err, "sandbox")
			}
			now := tx.Now()
			if sb.State != SandboxActive {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "sandbox %s is deleted", sb.ID)
			}
			if !now.Before(sb.ExpireTime) {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "sandbox %s expired at %s", sb.ID, sb.ExpireTime.UTC().Format(time.RFC3339))
			}
			in, err := instanceOf(ctx, tx.Tx, sb)
			if err != nil {
				return nil, err
			}
			if st := stateOf(sb, in); st != "running" {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "sandbox %s is %s; exec needs it running", sb.ID, st)
			}
			if grant, err = s.inst.GrantSSH(ctx, tx.Tx, in, pub, sb.ExpireTime, now); err != nil {
				return nil, err
			}
			tx.Emit(sandboxEvent("sandbox.exec_granted", &sb, map[string]any{"account": grant.Msg.GetAccount(),
				"key_fingerprint": grant.Fingerprint, "valid_before": grant.Msg.GetValidBefore().AsTime()}))
			return &apiv1.ExecSandboxResponse{Ticket: grant.Msg}, nil
		},
		Replayable: func(res *apiv1.ExecSandboxResponse) *apiv1.ExecSandboxResponse {
			return &apiv1.ExecSandboxResponse{Ticket: vps.StripTicket(res.GetTicket())}
		},
	})
	if err != nil {
		return nil, err
	}
	if grant != nil && res.Msg.GetTicket() != nil {
		if err := s.inst.IssueTicket(ctx, grant, res.Msg.GetTicket()); err != nil {
			return nil, s.env.Fail(ctx, err)
		}
	}
	return res, nil
}
