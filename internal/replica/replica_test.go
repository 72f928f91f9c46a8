package replica_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/replica"
)

// authority is a PKI of its own in a test database.
func authority(t *testing.T) *pki.Authority {
	t.Helper()
	clk := bctest.NewSimClock(time.Now())
	db := bctest.NewDB(t, clk)
	require.NoError(t, db.Migrate(t.Context(), pki.Migrations()))
	secret, err := pki.GenerateSecret()
	require.NoError(t, err)
	s, err := pki.NewSealer(secret)
	require.NoError(t, err)
	a, err := pki.Init(t.Context(), db, s, pki.InitOptions{})
	require.NoError(t, err)
	return a
}

func identity(t *testing.T, a replica.Authority, id string) *replica.Identity {
	t.Helper()
	r, err := replica.New(replica.Config{Authority: a, ReplicaID: id})
	require.NoError(t, err)
	return r
}

// serve runs a replica endpoint (Listen + Guard) on ln that answers with
// the peer replica it saw and the Authorization it got.
func serve(t *testing.T, id *replica.Identity, ln net.Listener) string {
	t.Helper()
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: id.Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer, _ := replica.Peer(r.Context())
		_, _ = io.WriteString(w, peer+" "+r.Header.Get("Authorization"))
	}))}
	go func() { _ = srv.Serve(id.Listen(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + ln.Addr().String()
}

func listen(t *testing.T, host string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	require.NoError(t, err)
	return ln
}

func get(c *http.Client, u string) (string, error) {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer bc_caller")
	res, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return "", &statusError{res.StatusCode, string(b)}
	}
	return string(b), err
}

type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string { return e.body }

// TestReplicaMutualTLS: two replicas of one PKI reach each other, each
// seeing the other's replica id, and the caller's bearer arrives.
func TestReplicaMutualTLS(t *testing.T) {
	t.Parallel()
	a := authority(t)
	ra, rb := identity(t, a, "rep_a"), identity(t, a, "rep_b")
	u := serve(t, rb, listen(t, "127.0.0.1"))
	got, err := get(ra.Client(time.Minute), u)
	require.NoError(t, err)
	require.Equal(t, "rep_a Bearer bc_caller", got)
}

// nonLoopback is an address of this host that is not loopback: proxies
// from the environment are never used for loopback, so only such an
// address shows whether a transport honours them.
func nonLoopback(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Fatal("this host has no non-loopback IPv4 address to test proxy bypass with")
	return ""
}

// TestForwardIgnoresProxy: with HTTPS_PROXY and HTTP_PROXY in its
// environment from the start, a process reaches a replica with the replica
// client directly: the proxy sees nothing. The same process with a
// transport that honours the environment (http.ProxyFromEnvironment) is
// sent to the proxy, so the environment is one that would have been used.
// The client runs in a child process because the standard library reads
// the proxy environment once per process.
func TestForwardIgnoresProxy(t *testing.T) {
	t.Parallel()
	var proxied atomic.Int32
	proxy := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		http.Error(w, "proxy says no", http.StatusBadGateway)
	})}
	pln := listen(t, "127.0.0.1")
	go func() { _ = proxy.Serve(pln) }()
	t.Cleanup(func() { _ = proxy.Close() })

	a := authority(t)
	u := serve(t, identity(t, a, "rep_b"), listen(t, nonLoopback(t)))
	cert, err := a.IssueReplica("rep_a")
	require.NoError(t, err)
	dir := t.TempDir()
	var certPEM []byte
	for _, der := range cert.Certificate {
		certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		break
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cert.pem"), certPEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))

	child := func(mode string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestProxyChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "HTTPS_PROXY=http://"+pln.Addr().String(), "HTTP_PROXY=http://"+pln.Addr().String(),
			"NO_PROXY=", "no_proxy=", "BC_REPLICA_PROXY_CHILD="+mode, "BC_REPLICA_PROXY_DIR="+dir, "BC_REPLICA_PROXY_URL="+u)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := child("replica")
	require.NoError(t, err, out)
	require.Zero(t, proxied.Load(), "the replica client went through the proxy")

	out, err = child("environment")
	require.Error(t, err, "the control reached the replica directly: %s", out)
	require.NotZero(t, proxied.Load(), "the environment's proxy was not used by the control either: %s", out)
}

// TestProxyChild is TestForwardIgnoresProxy's child process: it fetches
// the replica endpoint as rep_a with the replica client ("replica") or
// with the same client honouring the proxy environment ("environment").
func TestProxyChild(t *testing.T) {
	mode := os.Getenv("BC_REPLICA_PROXY_CHILD")
	if mode == "" {
		return // only as TestForwardIgnoresProxy's child
	}
	dir := os.Getenv("BC_REPLICA_PROXY_DIR")
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
	require.NoError(t, err)
	cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0])
	require.NoError(t, err)
	id := identity(t, fixedAuthority{cert}, "rep_a")
	c := id.Client(time.Minute)
	if mode == "environment" {
		tr := id.Transport()
		tr.Proxy = http.ProxyFromEnvironment
		c = &http.Client{Transport: tr}
	}
	got, err := get(c, os.Getenv("BC_REPLICA_PROXY_URL"))
	require.NoError(t, err)
	require.Equal(t, "rep_a Bearer bc_caller", got)
}

// fixedAuthority hands out one certificate and accepts any server: the
// child tests where its requests go, not whom it trusts.
type fixedAuthority struct{ cert tls.Certificate }

func (f fixedAuthority) IssueReplica(string) (tls.Certificate, error) { return f.cert, nil }

func (fixedAuthority) VerifyReplica([]*x509.Certificate, x509.ExtKeyUsage, time.Time) (string, error) {
	return "rep_b", nil
}

// selfSigned is a server certificate no CA of the control plane issued,
// dressed as a replica's.
func selfSigned(t *testing.T, a *pki.Authority) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "rep_x", OrganizationalUnit: []string{"bc-role:replica"}},
		URIs: []*url.URL{a.ReplicaSPIFFEID("rep_x")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestClientRefusesForeignServer: a replica never sends a request (and
// the caller's bearer in it) to a server whose certificate the internal CA
// did not issue to a replica: a self-signed one, another control plane's
// replica, or this PKI's gateway serving certificate.
func TestClientRefusesForeignServer(t *testing.T) {
	t.Parallel()
	a, other := authority(t), authority(t)
	ra := identity(t, a, "rep_a")
	gw, err := a.IssueServing([]string{"127.0.0.1"})
	require.NoError(t, err)
	otherReplica, err := other.IssueReplica("rep_b")
	require.NoError(t, err)
	for name, cert := range map[string]tls.Certificate{
		"self-signed": selfSigned(t, a), "another control plane's replica": otherReplica, "the gateway's serving certificate": gw,
	} {
		var reached atomic.Int32
		ln := tls.NewListener(listen(t, "127.0.0.1"), &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert})
		srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached.Add(1) })}
		go func() { _ = srv.Serve(ln) }()
		_, err := get(ra.Client(time.Minute), "https://"+ln.Addr().String())
		require.ErrorContains(t, err, "replica: peer refused", name)
		require.Zero(t, reached.Load(), "%s: the request reached the server", name)
		_ = srv.Close()
	}
}

// TestServerRefusesNonReplicaClient: the replica listener completes no
// request for a client without a replica certificate of this PKI: none, a
// node's, or another control plane's replica's.
func TestServerRefusesNonReplicaClient(t *testing.T) {
	t.Parallel()
	a, other := authority(t), authority(t)
	rb := identity(t, a, "rep_b")
	u := serve(t, rb, listen(t, "127.0.0.1"))
	otherReplica, err := other.IssueReplica("rep_a")
	require.NoError(t, err)
	nodeKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "n"}}, nodeKey)
	require.NoError(t, err)
	chain, _, err := a.IssueNode(context.Background(), csr, "nod_1", pki.RoleNode, time.Hour)
	require.NoError(t, err)
	node := tls.Certificate{Certificate: chain, PrivateKey: nodeKey}

	for name, cert := range map[string]*tls.Certificate{"no certificate": nil, "a node certificate": &node, "another control plane's replica": &otherReplica} {
		// The client trusts the server (it is a real replica): only the
		// client's certificate is in question.
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true} //nolint:gosec // the server is not under test
		if cert != nil {
			c := *cert
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
		}
		_, err := get(&http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}, u)
		require.Error(t, err, name)
		require.False(t, strings.HasPrefix(err.Error(), "rep_"), "%s: answered %v", name, err)
	}
}

// TestGuardRefusesPlainRequests: the guard refuses a request that did not
// come over the replica listener's mutual TLS.
func TestGuardRefusesPlainRequests(t *testing.T) {
	t.Parallel()
	rb := identity(t, authority(t), "rep_b")
	ln := listen(t, "127.0.0.1")
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: rb.Guard(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("a plain request reached the handler")
	}))}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	_, err := get(http.DefaultClient, "http://"+ln.Addr().String())
	var se *statusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, http.StatusForbidden, se.code)
}
