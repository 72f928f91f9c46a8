package vps

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/crypto/ssh"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tunnel"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// SSH limits.
const (
	// HostCertTTL is how long a guest's host certificate is valid: the
	// guest keeps it for its life, and clients pin the guest by it.
	HostCertTTL = 365 * 24 * time.Hour
	// TunnelCommandTTL bounds instance.tunnel on its host.
	TunnelCommandTTL = 30 * time.Second
	// maxPublicKeyLen bounds a caller's public key (authorized_keys form).
	maxPublicKeyLen = 16 << 10
	sshCAID         = "default"
)

// errNoSSHCA: the control plane runs without a sealing secret.
var errNoSSHCA = errors.New("the control plane runs without BETTER_COMPUTE_SECRET, so it has no SSH certificate authority")

// sshCA caches the deployment's CA signer once it is known to be committed.
type sshCA struct {
	mu     sync.Mutex
	signer ssh.Signer
}

func sshCARef(id string) string { return "vps/ssh_ca/" + id }

// caIn returns the deployment's SSH CA signer, creating it in tx on first
// use. Only a signer read from a row that existed before is cached: one
// this transaction created could still roll back.
func (s *InstanceService) caIn(ctx context.Context, tx store.Tx) (ssh.Signer, error) {
	if s.sealer == nil {
		return nil, errNoSSHCA
	}
	s.ca.mu.Lock()
	cached := s.ca.signer
	s.ca.mu.Unlock()
	if cached != nil {
		return cached, nil
	}
	signer, err := s.readCA(ctx, tx)
	if err == nil {
		s.ca.mu.Lock()
		s.ca.signer = signer
		s.ca.mu.Unlock()
		return signer, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ssh ca: generate key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		return nil, fmt.Errorf("ssh ca: marshal key: %w", err)
	}
	pemBytes := pem.EncodeToMemory(block)
	sealed, err := s.sealer.Seal(sshCARef(sshCAID), pemBytes)
	if err != nil {
		return nil, fmt.Errorf("ssh ca: seal key: %w", err)
	}
	ca, err := sshca.Load(pemBytes, nil)
	if err != nil {
		return nil, err
	}
	// Two replicas creating it at once: the first row wins, and both
	// read it back.
	if err := sshCAInsert(ctx, tx, sshCAID, ca.AuthorizedKey(), base64.StdEncoding.EncodeToString(sealed), s.env.Clock().Now()); err != nil {
		return nil, fmt.Errorf("ssh ca: store: %w", err)
	}
	signer, err = s.readCA(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("ssh ca: read back: %w", err)
	}
	return signer, nil
}

func (s *InstanceService) readCA(ctx context.Context, q store.Querier) (ssh.Signer, error) {
	var pub, sealed string
	if err := sshCAGet(ctx, q, sshCAID).Scan(&pub, &sealed); err != nil {
		return nil, err
	}
	raw, err := base64.StdEncoding.DecodeString(sealed)
	if err != nil {
		return nil, fmt.Errorf("ssh ca: sealed key: %w", err)
	}
	pemBytes, err := s.sealer.Open(sshCARef(sshCAID), raw)
	if err != nil {
		return nil, fmt.Errorf("ssh ca: open key (is BETTER_COMPUTE_SECRET the one it was sealed with?): %w", err)
	}
	signer, err := ssh.ParsePrivateKey(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("ssh ca: parse key: %w", err)
	}
	return signer, nil
}

// SSHPrincipal is the one user certificate principal an instance's guest
// accepts: its id. Every guest trusts the same CA, so the principal is
// what keeps a certificate signed for one instance out of every other
// guest (the account name, which all guests share, would not).
func SSHPrincipal(instanceID string) string { return instanceID }

// SSHStale reports whether in's guest was seeded without a principal of
// its own although this control plane has a CA (a guest seeded before
// guests had their own): no certificate signed now opens it. A warm pool
// replaces such guests rather than hand them out.
func (s *InstanceService) SSHStale(in *Instance) bool {
	return s.sealer != nil && in.SSHPrincipal == ""
}

// seedSSH makes the guest trust the CA for user certificates made out to
// its own principal only, and gives it a fresh host key certified for its
// host id and address, so clients pin it. An instance with no principal
// (no sealing secret, so no CA) gets only the user's keys.
func (s *InstanceService) seedSSH(ctx context.Context, tx store.Tx, p *vmcmd.CreateParams, in *Instance, now time.Time) error {
	if in.SSHPrincipal == "" {
		return nil
	}
	signer, err := s.caIn(ctx, tx)
	if err != nil {
		return err
	}
	ca := sshca.FromSigner(signer, func() time.Time { return now })
	hk, err := sshca.NewHostKey()
	if err != nil {
		return err
	}
	cert, err := ca.SignHost(hk.Signer.PublicKey(), []string{HostID(in.ID), in.Address}, HostCertTTL)
	if err != nil {
		return err
	}
	p.Seed.TrustedUserCAKeys = []string{ca.AuthorizedKey()}
	p.Seed.AuthorizedPrincipals = []string{in.SSHPrincipal}
	p.Seed.HostKey = string(hk.PrivatePEM)
	p.Seed.HostCertificate = sshca.MarshalCert(cert)
	return nil
}

// ParsePublicKey checks a caller's SSH public key (authorized_keys form,
// one plain key) and adds a violation on field when it is not one.
func ParsePublicKey(vs *envelope.Violations, field, value string) ssh.PublicKey {
	switch {
	case value == "":
		vs.Add(field, "is required (an SSH public key in authorized_keys form)")
		return nil
	case len(value) > maxPublicKeyLen:
		vs.Add(field, "is longer than %d bytes", maxPublicKeyLen)
		return nil
	}
	pub, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(value))
	switch {
	case err != nil:
		vs.Add(field, "is not an SSH public key in authorized_keys form")
		return nil
	case len(rest) > 0 && len(trimSpace(rest)) > 0:
		vs.Add(field, "must hold exactly one key")
		return nil
	}
	if _, ok := pub.(*ssh.Certificate); ok {
		vs.Add(field, "must be a plain public key, not a certificate")
		return nil
	}
	return pub
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\n' || b[0] == '\r' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// SSHGrant is a signed user certificate for one instance and the ticket it
// goes with, issued (IssueTicket) only once its transaction committed.
type SSHGrant struct {
	Msg         *apiv1.SshTicket
	Fingerprint string
	ticket      tunnel.Ticket
}

// GrantSSH signs pub for a running instance's guest account, made out to
// that instance's principal only (so it logs into no other guest), valid
// for at most sshca.MaxUserTTL and never past notAfter (when set).
func (s *InstanceService) GrantSSH(ctx context.Context, tx store.Tx, in *Instance, pub ssh.PublicKey, notAfter, now time.Time) (*SSHGrant, error) {
	if in.State != StateRunning {
		return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "instance %s is %s; ssh needs it running", in.Name, in.State)
	}
	if in.SSHAddress == "" || in.NodeID == "" {
		return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "instance %s has not reported an SSH address yet", in.Name)
	}
	if s.tunnels == nil {
		return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "this control plane carries no SSH tunnels")
	}
	signer, err := s.caIn(ctx, tx)
	if errors.Is(err, errNoSSHCA) {
		return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "%v", err)
	}
	if err != nil {
		return nil, err
	}
	if in.SSHPrincipal == "" {
		// Seeded before guests had their own principal (they accept any
		// certificate for the shared account, which is no longer signed)
		// or seeded without the CA: no certificate of ours logs in.
		return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
			"instance %s was created without its own SSH principal, so its guest accepts no certificate this control plane signs; recreate it to use ssh (docs/instances.md)", in.Name)
	}
	ttl := sshca.MaxUserTTL
	if !notAfter.IsZero() {
		left := notAfter.Sub(now).Truncate(time.Second)
		if left < time.Second {
			return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "instance %s expires at %s; no certificate can be issued", in.Name,
				notAfter.UTC().Format(time.RFC3339))
		}
		ttl = min(ttl, left)
	}
	ca := sshca.FromSigner(signer, func() time.Time { return now })
	cert, err := ca.SignUser(pub, in.SSHPrincipal, ttl)
	if err != nil {
		return nil, err
	}
	validBefore := time.Unix(int64(cert.ValidBefore), 0)
	msg := &apiv1.SshTicket{UserCertificate: sshca.MarshalCert(cert), HostCaKey: ca.AuthorizedKey(), Account: GuestUser,
		HostName: HostID(in.ID), ValidBefore: timestamppb.New(validBefore)}
	expire := now.Add(tunnel.TicketTTL)
	if validBefore.Before(expire) {
		expire = validBefore
	}
	return &SSHGrant{Msg: msg, Fingerprint: ssh.FingerprintSHA256(pub), ticket: tunnel.Ticket{TenantID: in.TenantID, InstanceID: in.ID,
		HostID: HostID(in.ID), NodeID: in.NodeID, Expire: expire}}, nil
}

// IssueTicket records the grant's ticket, for any replica to redeem once,
// and fills it in.
func (s *InstanceService) IssueTicket(ctx context.Context, g *SSHGrant, msg *apiv1.SshTicket) error {
	id, err := tunnel.NewID()
	if err != nil {
		return err
	}
	if err := s.env.DB().Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return TicketInsert(ctx, tx, id, g.ticket, s.env.Clock().Now())
	}); err != nil {
		return fmt.Errorf("record the ssh ticket: %w", err)
	}
	msg.Ticket, msg.TicketExpireTime = id, timestamppb.New(g.ticket.Expire)
	return nil
}

// RedeemTicket uses ticket id: it answers once, before the ticket expires.
// An unknown, used or expired ticket is one error (errTicket), so a probe
// learns nothing about which.
func (s *InstanceService) RedeemTicket(ctx context.Context, id string) (tunnel.Ticket, error) {
	var t tunnel.Ticket
	err := s.env.DB().Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		t, err = TicketRedeem(ctx, tx, id)
		return err
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return tunnel.Ticket{}, errTicket
	case err != nil:
		return tunnel.Ticket{}, err
	case !s.env.Clock().Now().Before(t.Expire):
		return tunnel.Ticket{}, errTicket
	}
	return t, nil
}

// errTicket: the ticket is unknown, used or expired.
var errTicket = errors.New("the ssh ticket is unknown, used or expired")

// StripTicket is what an idempotent replay may answer: the ticket and the
// certificate are credentials and are not stored.
func StripTicket(t *apiv1.SshTicket) *apiv1.SshTicket {
	if t == nil {
		return nil
	}
	c := proto.Clone(t).(*apiv1.SshTicket)
	c.Ticket, c.UserCertificate, c.TicketExpireTime = "", "", nil
	return c
}

// Tunnels is the replica's hub of tunnels waiting for their node.
func (s *InstanceService) Tunnels() *tunnel.Hub { return s.tunnels }

// Ssh signs the caller's key for an instance's guest account and issues a
// tunnel ticket.
func (s *InstanceService) Ssh(ctx context.Context, req *connect.Request[apiv1.SshInstanceRequest]) (*connect.Response[apiv1.SshInstanceResponse], error) {
	msg := req.Msg
	var (
		r     instanceRef
		pub   ssh.PublicKey
		grant *SSHGrant
	)
	res, err := envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.SshInstanceResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			validateInstanceRef(&vs, msg.GetTenant(), msg.GetInstance())
			pub = ParsePublicKey(&vs, "public_key", msg.GetPublicKey())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupInstance(ctx, q, msg.GetTenant(), msg.GetInstance())
			return r.Resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.SshInstanceResponse, error) {
			if err := r.NotFound(msg.GetInstance()); err != nil {
				return nil, err
			}
			in, err := InstanceByID(ctx, tx.Tx, r.Obj.ID, "")
			if err != nil {
				return nil, envelope.FromStore(err, "instance")
			}
			if err := s.checkOwner(ctx, tx.Tx, &in); err != nil {
				return nil, err
			}
			now := tx.Now()
			if grant, err = s.GrantSSH(ctx, tx.Tx, &in, pub, time.Time{}, now); err != nil {
				return nil, err
			}
			tx.Emit(instanceEvent("instance.ssh_granted", &in, map[string]any{"account": grant.Msg.GetAccount(),
				"key_fingerprint": grant.Fingerprint, "valid_before": grant.Msg.GetValidBefore().AsTime()}))
			return &apiv1.SshInstanceResponse{Ticket: grant.Msg}, nil
		},
		Replayable: func(res *apiv1.SshInstanceResponse) *apiv1.SshInstanceResponse {
			return &apiv1.SshInstanceResponse{Ticket: StripTicket(res.GetTicket())}
		},
	})
	if err != nil {
		return nil, err
	}
	if grant != nil && res.Msg.GetTicket() != nil {
		if err := s.IssueTicket(ctx, grant, res.Msg.GetTicket()); err != nil {
			return nil, s.env.Fail(ctx, err)
		}
	}
	return res, nil
}

// OpenTunnel asks the ticket's node to open tunnelID to its guest's sshd
// (instance.tunnel), after checking the instance still runs there.
func (s *InstanceService) OpenTunnel(ctx context.Context, t tunnel.Ticket, tunnelID string) error {
	return s.env.DB().Write(ctx, func(ctx context.Context, tx store.Tx) error {
		in, err := InstanceByID(ctx, tx, t.InstanceID, "")
		if err != nil {
			return envelope.FromStore(err, "instance")
		}
		if in.TenantID != t.TenantID || in.NodeID != t.NodeID || in.State != StateRunning {
			return envelope.Errorf(envelope.CodeFailedPrecondition, "instance %s is %s on %s; the ticket was issued for it running on %s",
				in.Name, in.State, in.NodeID, t.NodeID)
		}
		now := s.env.Clock().Now()
		m, err := paramsMap(vmcmd.TunnelParams{InstanceID: t.HostID, TunnelID: tunnelID})
		if err != nil {
			return err
		}
		if _, err := s.engine.Commands.Send(ctx, tx, reservation.Command{TenantID: in.TenantID, NodeID: in.NodeID, Kind: vmcmd.KindInstanceTunnel,
			Params: m, IdempotencyKey: "tunnel/" + tunnelID, CreatedBy: Principal, TTL: TunnelCommandTTL, Time: now}); err != nil {
			return fmt.Errorf("send %s: %w", vmcmd.KindInstanceTunnel, err)
		}
		return nil
	})
}
