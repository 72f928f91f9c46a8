package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// dial opens a client connection to the gateway at gw with tlsConf. The
// passthrough scheme keeps host:port as given: names were resolved by
// gateways, which picks the address.
func (a *Agent) dial(gw gatewayAddr, tlsConf *tls.Config) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsConf)),
		// Pings notice a gateway that vanished without closing the
		// connection (its host died, a middlebox dropped the flow).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: a.cfg.KeepaliveTime, Timeout: a.cfg.KeepaliveTimeout}),
	}
	if a.cfg.Dialer != nil {
		opts = append(opts, grpc.WithContextDialer(a.cfg.Dialer))
	}
	conn, err := grpc.NewClient("passthrough:///"+gw.addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial gateway %s: %w", gw.addr, err)
	}
	return conn, nil
}

// mtlsConfig verifies the gateway against the saved trust bundle and
// presents the current node certificate (read at each handshake, so a
// renewal applies to the next connection). serverName is the name the
// gateway's certificate must carry: the configured host of its address.
func (a *Agent) mtlsConfig(serverName string) *tls.Config {
	a.mu.Lock()
	roots := a.roots
	a.mu.Unlock()
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    roots,
		ServerName: serverName,
		Time:       a.cfg.Clock.Now,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.cert == nil {
				return nil, ErrNotJoined
			}
			return a.cert, nil
		},
	}
}

// Join exchanges token for a node certificate. The key is made here and
// never sent. A pending join (operator approval) is retried with the same
// CSR after the gateway's retry_after until ctx ends. The key and CSR are
// kept in the state dir, so a restart while pending resumes the same join.
func (a *Agent) Join(ctx context.Context, token string) error {
	if a.Joined() {
		return ErrAlreadyJoined
	}
	pin, err := TokenPin(token)
	if err != nil {
		return err
	}
	key, csr, err := a.joinKeyAndCSR()
	if err != nil {
		return err
	}
	id, err := a.identity(ctx)
	if err != nil {
		return err
	}
	// Every gateway of one round is asked in turn: a replica that is down
	// (unreachable, refusing connections) is passed for the next.
	round, err := a.gws.resolve(ctx)
	if err != nil {
		return err
	}
	req := &agentv1.JoinRequest{Token: token, CsrDer: csr, Identity: id, AgentVersion: a.cfg.Version, Mode: a.cfg.Mode}
	var errs []error
	for _, gw := range round {
		err := a.joinAt(ctx, gw, pin, key, req)
		if err == nil || status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return err
		}
		a.log.Warn("join: gateway unavailable, trying the next", "gateway", gw.addr, "err", err)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// joinAt asks the gateway at gw to admit the node, waiting out a pending
// approval on the same connection.
func (a *Agent) joinAt(ctx context.Context, gw gatewayAddr, pin []byte, key *ecdsa.PrivateKey, req *agentv1.JoinRequest) error {
	conn, err := a.dial(gw, &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The node has no trust bundle yet: the pin from the token is the
		// trust anchor, checked by PinVerifier instead of the default chain
		// verification.
		InsecureSkipVerify:    true, //nolint:gosec // verified by PinVerifier
		VerifyPeerCertificate: PinVerifier(pin, a.cfg.Clock.Now),
	})
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	client := agentv1.NewAgentServiceClient(conn)
	for {
		resp, err := client.Join(ctx, req)
		if err != nil {
			return fmt.Errorf("join at %s: %w", gw.addr, err)
		}
		switch resp.GetStatus() {
		case agentv1.JoinStatus_JOIN_STATUS_ADMITTED:
			if err := a.saveIdentity(key, resp.GetNodeId(), resp.GetTrustDomain(), resp.GetCertificateChain(), resp.GetTrustBundlePem()); err != nil {
				return err
			}
			if err := a.pinCommandTrust(resp.GetCommandTrust(), true); err != nil {
				return err
			}
			_ = a.dir.remove(csrFile)
			a.log.Info("joined", "node_id", resp.GetNodeId(), "not_after", resp.GetNotAfter().AsTime())
			return nil
		case agentv1.JoinStatus_JOIN_STATUS_PENDING_APPROVAL:
			wait := time.Duration(max(resp.GetRetryAfterSeconds(), 1)) * time.Second
			a.log.Info("join pending approval", "join_request_id", resp.GetJoinRequestId(), "reason", resp.GetReason(), "retry_after", wait)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("join pending approval (request %s): %w", resp.GetJoinRequestId(), ctx.Err())
			case <-t.C:
			}
		default:
			return fmt.Errorf("join: unexpected status %s", resp.GetStatus())
		}
	}
}

// joinKeyAndCSR loads the pending join's key and CSR or makes new ones.
func (a *Agent) joinKeyAndCSR() (*ecdsa.PrivateKey, []byte, error) {
	if b, err := a.dir.read(keyFile); err == nil {
		key, err := decodeKey(b)
		if err != nil {
			return nil, nil, err
		}
		if csr, err := a.dir.read(csrFile); err == nil {
			return key, csr, nil
		}
		csr, err := makeCSR(key)
		if err != nil {
			return nil, nil, err
		}
		return key, csr, a.dir.write(csrFile, csr)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("read node key: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate node key: %w", err)
	}
	pemKey, err := encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := a.dir.write(keyFile, pemKey); err != nil {
		return nil, nil, err
	}
	csr, err := makeCSR(key)
	if err != nil {
		return nil, nil, err
	}
	return key, csr, a.dir.write(csrFile, csr)
}

func makeCSR(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "bcd"},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("create csr: %w", err)
	}
	return der, nil
}

// saveIdentity checks that the issued certificate is for key and stores
// everything; the key is written last under its final name so that a crash
// leaves either the old pair or node.key.new next to the new certificate.
func (a *Agent) saveIdentity(key *ecdsa.PrivateKey, nodeID, trustDomain string, chain [][]byte, bundle []byte) error {
	if len(chain) == 0 {
		return errors.New("gateway returned no certificate")
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return fmt.Errorf("parse issued certificate: %w", err)
	}
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return errors.New("issued certificate is not for the node's key")
	}
	if len(bundle) > 0 {
		if !x509.NewCertPool().AppendCertsFromPEM(bundle) {
			return errors.New("gateway returned an unusable trust bundle")
		}
		if err := a.dir.write(trustFile, bundle); err != nil {
			return err
		}
	}
	pemKey, err := encodeKey(key)
	if err != nil {
		return err
	}
	if err := a.dir.write(newKeyFile, pemKey); err != nil {
		return err
	}
	if err := a.dir.write(certFile, encodeChain(chain)); err != nil {
		return err
	}
	if err := a.dir.rename(newKeyFile, keyFile); err != nil {
		return err
	}
	if nodeID != "" {
		a.mu.Lock()
		a.node = nodeState{NodeID: nodeID, TrustDomain: trustDomain}
		n := a.node
		a.mu.Unlock()
		if err := a.dir.writeJSON(nodeFile, n); err != nil {
			return err
		}
	}
	return a.loadIdentity()
}

// renewSignedBytes is what a RenewRequest's signature covers:
// SHA-256(nonce || time (RFC 3339 nano, UTC) || csr_der).
func renewSignedBytes(nonce []byte, t time.Time, csr []byte) []byte {
	h := sha256.New()
	h.Write(nonce)
	h.Write([]byte(t.UTC().Format(time.RFC3339Nano)))
	h.Write(csr)
	return h.Sum(nil)
}

// Renew obtains a certificate for a fresh key over mTLS with the current
// one, proving possession of the current key by signing the request.
func (a *Agent) Renew(ctx context.Context) error {
	a.mu.Lock()
	cur := a.cert
	a.mu.Unlock()
	if cur == nil {
		return ErrNotJoined
	}
	curKey, ok := cur.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return errors.New("node key is not ECDSA")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate node key: %w", err)
	}
	csr, err := makeCSR(key)
	if err != nil {
		return err
	}
	nonce := make([]byte, 32)
	if _, err := rand.Read(nonce); err != nil {
		return fmt.Errorf("renew nonce: %w", err)
	}
	now := a.cfg.Clock.Now().UTC()
	sig, err := ecdsa.SignASN1(rand.Reader, curKey, renewSignedBytes(nonce, now, csr))
	if err != nil {
		return fmt.Errorf("sign renew request: %w", err)
	}
	// The session's gateway, or the one it is trying: a renewal failing
	// there is retried as the session moves on.
	gw, err := a.gws.current(ctx)
	if err != nil {
		return err
	}
	conn, err := a.dial(gw, a.mtlsConfig(gw.serverName))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	resp, err := agentv1.NewAgentServiceClient(conn).Renew(ctx, &agentv1.RenewRequest{
		CsrDer: csr, Nonce: nonce, Time: timestamppb.New(now), Signature: sig,
	})
	if err != nil {
		a.metrics.renewals.WithLabelValues("error").Inc()
		return fmt.Errorf("renew at %s: %w", gw.addr, err)
	}
	if err := a.saveIdentity(key, "", "", resp.GetCertificateChain(), resp.GetTrustBundlePem()); err != nil {
		a.metrics.renewals.WithLabelValues("error").Inc()
		return err
	}
	if err := a.pinCommandTrust(resp.GetCommandTrust(), false); err != nil {
		a.metrics.renewals.WithLabelValues("error").Inc()
		return err
	}
	a.metrics.renewals.WithLabelValues("ok").Inc()
	a.log.Info("certificate renewed", "not_after", a.Certificate().NotAfter)
	return nil
}

// renewAt is when 2/3 of the certificate's lifetime has passed.
func renewAt(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(life * 2 / 3)
}

// renewLoop renews the certificate at 2/3 of its lifetime, retrying with
// backoff on failure, until ctx ends.
func (a *Agent) renewLoop(ctx context.Context) {
	bo := backoff{min: time.Second, max: time.Minute}
	for {
		leaf := a.Certificate()
		if leaf == nil {
			return
		}
		wait := renewAt(leaf).Sub(a.cfg.Clock.Now())
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if err := a.Renew(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			d := bo.next()
			a.log.Warn("certificate renewal failed", "err", err, "retry_in", d)
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		bo.reset()
	}
}
