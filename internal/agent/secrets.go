package agent

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/nodesecret"
)

// secretIdentity is what a fetch is made as: one certificate, whose key
// signs the request and whose leaf the TLS handshake presents, so a
// renewal in between cannot split the two.
type secretIdentity struct {
	cert        *tls.Certificate
	roots       *x509.CertPool
	nodeID      string
	trustDomain string
}

// pinnedTLS presents exactly id's certificate, whatever a renewal does
// meanwhile.
func (id secretIdentity) pinnedTLS(serverName string, now func() time.Time) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13, RootCAs: id.roots, ServerName: serverName, Time: now,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return id.cert, nil },
	}
}

// trustDomainOf is the trust domain of a node certificate's SPIFFE id,
// for a node whose state predates keeping it.
func trustDomainOf(leaf *x509.Certificate) string {
	for _, u := range leaf.URIs {
		if u.Scheme == "spiffe" {
			return u.Host
		}
	}
	return ""
}

// FetchSecret asks the gateway for ref (secret://NAME), a secret of this
// node's tenant that the tenant marked node-readable. The request is signed
// with the node's current key and names a fresh X25519 key made for it
// alone; the answer opens only with that key, here, and the key is dropped
// after.
func (a *Agent) FetchSecret(ctx context.Context, ref string) ([]byte, error) {
	a.mu.Lock()
	id := secretIdentity{cert: a.cert, roots: a.roots, nodeID: a.node.NodeID, trustDomain: a.node.TrustDomain}
	a.mu.Unlock()
	if id.cert == nil || id.nodeID == "" {
		return nil, ErrNotJoined
	}
	gw, err := a.gws.current(ctx)
	if err != nil {
		return nil, err
	}
	conn, err := a.dial(gw, id.pinnedTLS(gw.serverName, a.cfg.Clock.Now))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	v, err := fetchSecret(ctx, agentv1.NewAgentServiceClient(conn), id, a.cfg.Clock.Now(), ref)
	if err != nil {
		return nil, fmt.Errorf("fetch %s at %s: %w", ref, gw.addr, err)
	}
	return v, nil
}

// fetchSecret makes, signs and sends one request and opens its answer.
func fetchSecret(ctx context.Context, c agentv1.AgentServiceClient, id secretIdentity, now time.Time, ref string) ([]byte, error) {
	signer, ok := id.cert.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("the node key cannot sign")
	}
	td := id.trustDomain
	if td == "" && id.cert.Leaf != nil {
		td = trustDomainOf(id.cert.Leaf)
	}
	key, err := nodesecret.NewKey()
	if err != nil {
		return nil, fmt.Errorf("make the answer's key: %w", err)
	}
	nonce := make([]byte, 32)
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("fetch nonce: %w", err)
	}
	req := &agentv1.FetchSecretRequest{Ref: ref, Nonce: nonce, Time: timestamppb.New(now.UTC()), RecipientPublicKey: key.PublicKey().Bytes()}
	if err := nodesecret.Sign(signer, td, id.nodeID, req); err != nil {
		return nil, err
	}
	resp, err := c.FetchSecret(ctx, req)
	if err != nil {
		return nil, err
	}
	return nodesecret.Open(key, nodesecret.Binding{TrustDomain: td, NodeID: id.nodeID, Ref: ref, Version: resp.GetVersion(), Nonce: nonce},
		resp.GetEncapsulatedKey(), resp.GetCiphertext())
}

// StateFetchConfig is what FetchSecretWithState needs: the gateways and
// the state directory of a node that joined.
type StateFetchConfig struct {
	// Server is bcd's --server: one or more gateway HOST:PORT.
	Server   string
	StateDir string
	Clock    clock.Clock
	// LookupHost resolves a gateway's name (default net.DefaultResolver).
	LookupHost func(ctx context.Context, host string) ([]string, error)
}

// FetchSecretWithState is FetchSecret for `bcd secret get`: it runs beside
// the node's running bcd, as the identity in the state directory, and
// writes nothing there (no command log, no session). It tries each gateway
// address once, moving on only when one is unreachable.
func FetchSecretWithState(ctx context.Context, cfg StateFetchConfig, ref string) ([]byte, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.LookupHost == nil {
		cfg.LookupHost = net.DefaultResolver.LookupHost
	}
	entries, err := ParseServers(cfg.Server)
	if err != nil {
		return nil, err
	}
	id, err := readSecretIdentity(stateDir(cfg.StateDir))
	if err != nil {
		return nil, err
	}
	round, err := (&gateways{entries: entries, lookup: cfg.LookupHost}).resolve(ctx)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, gw := range round {
		conn, err := grpc.NewClient("passthrough:///"+gw.addr,
			grpc.WithTransportCredentials(credentials.NewTLS(id.pinnedTLS(gw.serverName, cfg.Clock.Now))))
		if err != nil {
			return nil, fmt.Errorf("dial gateway %s: %w", gw.addr, err)
		}
		v, err := fetchSecret(ctx, agentv1.NewAgentServiceClient(conn), id, cfg.Clock.Now(), ref)
		_ = conn.Close()
		if err == nil {
			return v, nil
		}
		errs = append(errs, fmt.Errorf("fetch %s at %s: %w", ref, gw.addr, err))
		if status.Code(err) != codes.Unavailable {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// readSecretIdentity reads the node's identity from its state directory.
func readSecretIdentity(d stateDir) (secretIdentity, error) {
	var node nodeState
	ok, err := d.readJSON(nodeFile, &node)
	if err != nil {
		return secretIdentity{}, err
	}
	if !ok || node.NodeID == "" {
		return secretIdentity{}, fmt.Errorf("%w: no node identity in %s", ErrNotJoined, string(d))
	}
	cert, err := d.loadCredentials()
	if err != nil {
		return secretIdentity{}, err
	}
	bundle, err := d.read(trustFile)
	if err != nil {
		return secretIdentity{}, fmt.Errorf("read trust bundle: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		return secretIdentity{}, errors.New("trust bundle holds no certificates")
	}
	if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
		return secretIdentity{}, fmt.Errorf("parse node certificate: %w", err)
	}
	cert.Certificate = cert.Certificate[:1]
	return secretIdentity{cert: cert, roots: roots, nodeID: node.NodeID, trustDomain: node.TrustDomain}, nil
}
