// Package replica is how control plane replicas talk to each other: each
// holds a certificate from the PKI's internal CA naming it a replica
// (spiffe://<trust-domain>/replica/<id>), and every replica-to-replica
// connection is mutual TLS on which both ends check that identity. It builds
// the client side (an *http.Client, or a raw TLS dialer, that never goes
// through a proxy) and the server side (a tls.Config and a handler guard).
//
// It must never send anything to, or accept anything from, a peer that has
// not proved it is a replica of this control plane: no proxy from the
// environment, no fallback to plain text, no hostname-only trust.
package replica

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Authority is the part of the PKI (pki.Authority) replicas need.
type Authority interface {
	// IssueReplica issues this replica's certificate.
	IssueReplica(replicaID string) (tls.Certificate, error)
	// VerifyReplica checks a peer's chain (leaf first) as a replica's for
	// usage at now, and returns its replica id.
	VerifyReplica(chain []*x509.Certificate, usage x509.ExtKeyUsage, now time.Time) (string, error)
}

// Config configures an Identity.
type Config struct {
	Authority Authority
	// ReplicaID is this replica's id (the placer's, in placer_owners).
	ReplicaID string
	// Now is the clock certificates are checked and renewed by; default
	// time.Now.
	Now func() time.Time
	// DialTimeout bounds a connection's TCP and TLS handshake; default 10 s.
	DialTimeout time.Duration
}

// Identity is this replica's certificate, renewed once two thirds of its
// lifetime passed, and the TLS configurations built on it.
type Identity struct {
	cfg Config

	mu   sync.Mutex
	cert *tls.Certificate
	gen  int64 // the authority's serving generation when cert was issued
}

// generational is an Authority that rotates its roots (pki.Authority): a
// certificate of a generation that no longer serves is replaced at once.
type generational interface{ ServingGeneration() int64 }

func (id *Identity) servingGeneration() int64 {
	if g, ok := id.cfg.Authority.(generational); ok {
		return g.ServingGeneration()
	}
	return 0
}

// New issues the replica's first certificate.
func New(cfg Config) (*Identity, error) {
	if cfg.Authority == nil {
		return nil, errors.New("replica: no certificate authority (is BETTER_COMPUTE_SECRET set?)")
	}
	if cfg.ReplicaID == "" {
		return nil, errors.New("replica: no replica id")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.DialTimeout = cmp.Or(cfg.DialTimeout, 10*time.Second)
	id := &Identity{cfg: cfg}
	if _, err := id.certificate(); err != nil {
		return nil, err
	}
	return id, nil
}

// ReplicaID is the id this replica's certificate names.
func (id *Identity) ReplicaID() string { return id.cfg.ReplicaID }

// certificate returns the current certificate, renewing it when two
// thirds of its lifetime passed. A failed renewal keeps the current one
// while it is valid.
func (id *Identity) certificate() (*tls.Certificate, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	now := id.cfg.Now()
	gen := id.servingGeneration()
	if c := id.cert; c != nil && id.gen == gen {
		life := c.Leaf.NotAfter.Sub(c.Leaf.NotBefore)
		if now.Before(c.Leaf.NotBefore.Add(life * 2 / 3)) {
			return c, nil
		}
	}
	c, err := id.cfg.Authority.IssueReplica(id.cfg.ReplicaID)
	if err != nil {
		if id.cert != nil && now.Before(id.cert.Leaf.NotAfter) {
			return id.cert, nil
		}
		return nil, fmt.Errorf("replica: certificate: %w", err)
	}
	id.cert, id.gen = &c, gen
	return id.cert, nil
}

// verify checks the peer of a handshake as a replica.
func (id *Identity) verify(cs tls.ConnectionState, usage x509.ExtKeyUsage) (string, error) {
	peer, err := id.cfg.Authority.VerifyReplica(cs.PeerCertificates, usage, id.cfg.Now())
	if err != nil {
		return "", fmt.Errorf("replica: peer refused: %w", err)
	}
	return peer, nil
}

// ClientTLS is the TLS configuration of a connection to another replica:
// it presents this replica's certificate and accepts only a server whose
// certificate the internal CA issued to a replica. The server's host name
// is not what is trusted (owner rows hold whatever address a replica
// advertised): its replica certificate is.
func (id *Identity) ClientTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return id.certificate()
		},
		// The chain is verified in VerifyConnection, against the internal
		// CA alone and for the replica identity, not against a host name.
		InsecureSkipVerify: true, //nolint:gosec // VerifyConnection verifies
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := id.verify(cs, x509.ExtKeyUsageServerAuth)
			return err
		},
	}
}

// ServerTLS is the TLS configuration of the replica listener: it presents
// this replica's certificate and completes a handshake only with a client
// that presents a replica certificate of the internal CA.
func (id *Identity) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return id.certificate()
		},
		ClientAuth: tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := id.verify(cs, x509.ExtKeyUsageClientAuth)
			return err
		},
		NextProtos: []string{"h2", "http/1.1"},
	}
}

// Transport is an HTTP transport to other replicas: mutual TLS (ClientTLS),
// HTTP/2, and never a proxy, whatever HTTP(S)_PROXY says.
func (id *Identity) Transport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: id.cfg.DialTimeout}).DialContext,
		TLSClientConfig:     id.ClientTLS(),
		TLSHandshakeTimeout: id.cfg.DialTimeout,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
}

// Client is an HTTP client to other replicas on Transport; timeout bounds
// each request (0: none, for streams).
func (id *Identity) Client(timeout time.Duration) *http.Client {
	return &http.Client{Transport: id.Transport(), Timeout: timeout,
		// A redirect could only lead away from the replica that was
		// verified.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// DialTLS opens a mutual TLS connection to the replica at addr (host:port)
// directly (no proxy), for a byte stream that is not HTTP. The handshake
// is done when it returns; Peer names the replica at the other end.
func (id *Identity) DialTLS(ctx context.Context, addr string) (*tls.Conn, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: id.cfg.DialTimeout}, Config: id.ClientTLS()}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*tls.Conn), nil
}

// Listen wraps ln so every accepted connection is a TLS server on
// ServerTLS: a handshake with anything but a replica fails.
func (id *Identity) Listen(ln net.Listener) net.Listener { return tls.NewListener(ln, id.ServerTLS()) }

type peerKey struct{}

// Guard admits a request only on a TLS connection whose client proved a
// replica identity, and records that identity (Peer). It checks again what
// ServerTLS checked at the handshake, so a handler mounted elsewhere by
// mistake still refuses everyone.
func (id *Identity) Guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			http.Error(w, "replica endpoint: mutual TLS required", http.StatusForbidden)
			return
		}
		peer, err := id.verify(*r.TLS, x509.ExtKeyUsageClientAuth)
		if err != nil {
			http.Error(w, "replica endpoint: "+err.Error(), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), peerKey{}, peer)))
	})
}

// VerifyClient checks a connection's client as Guard does and returns its
// replica id: for a handler that answers refusals in its own format.
func (id *Identity) VerifyClient(cs tls.ConnectionState) (string, error) {
	return id.verify(cs, x509.ExtKeyUsageClientAuth)
}

// TunnelTransport is an HTTP/1.1 transport to other replicas (mutual TLS as
// Transport, never a proxy): a forwarded tunnel is an HTTP upgrade, which
// HTTP/2 does not carry.
func (id *Identity) TunnelTransport() *http.Transport {
	cfg := id.ClientTLS()
	cfg.NextProtos = []string{"http/1.1"}
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: id.cfg.DialTimeout}).DialContext,
		TLSClientConfig:     cfg,
		TLSHandshakeTimeout: id.cfg.DialTimeout,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}
}

// Peer returns the replica a request reached this one from, set by Guard;
// false on a request that did not come from a replica.
func Peer(ctx context.Context) (string, bool) {
	p, ok := ctx.Value(peerKey{}).(string)
	return p, ok
}

// PeerOfConn returns the replica at the other end of a connection whose
// handshake (DialTLS, or Listen's) is done.
func (id *Identity) PeerOfConn(c *tls.Conn) (string, error) {
	return id.verify(c.ConnectionState(), x509.ExtKeyUsageAny)
}
