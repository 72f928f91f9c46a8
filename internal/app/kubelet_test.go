package app_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/hw/fake"
	"github.com/better-compute/better-compute/internal/pki"
)

// clusterCA is a Kubernetes cluster's CA (kubeadm's /etc/kubernetes/pki/ca.crt).
type clusterCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

func newClusterCA(t *testing.T) clusterCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return clusterCA{cert: c, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// client writes a client certificate of subject (cn, org) and its key into
// one PEM file, as the kubelet keeps kubelet-client-current.pem.
func (ca clusterCA) client(t *testing.T, dir, cn string, org ...string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject: pkix.Name{CommonName: cn, Organization: org}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour)},
		ca.cert, key.Public(), ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	p := filepath.Join(dir, "kubelet-client-current.pem")
	require.NoError(t, os.WriteFile(p, append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})...), 0o600))
	return p
}

// nodeLabels stands in for bcd's Node watcher: labels that change.
type nodeLabels struct {
	mu      sync.Mutex
	labels  map[string]string
	changed chan struct{}
}

func (l *nodeLabels) get(context.Context) (map[string]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.labels), nil
}

func (l *nodeLabels) watch() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

func (l *nodeLabels) set(m map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.labels = m
	close(l.changed)
	l.changed = make(chan struct{})
}

// kubeletMachine is one machine's sysfs and state, and an agent on it.
func kubeletMachine(t *testing.T, cp *bctest.ControlPlane, host, certFile string, labels *nodeLabels) *agent.Agent {
	t.Helper()
	root := t.TempDir()
	for rel, v := range map[string]string{"sys/class/dmi/id/product_uuid": "5e1d2e3f-0000-4000-8000-" + fmtHost(host),
		"sys/class/dmi/id/product_serial": "SER-" + host, "sys/class/dmi/id/board_serial": "BRD-" + host, "proc/sys/kernel/hostname": host,
		"proc/cpuinfo": "processor\t: 0\nmodel name\t: rig cpu\n", "proc/meminfo": "MemTotal: 1048576 kB\nMemAvailable: 524288 kB"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, rel)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, rel), []byte(v+"\n"), 0o644))
	}
	state := t.TempDir()
	backend, err := fake.New(fake.Options{Model: "dgxh100", Seed: state})
	require.NoError(t, err)
	cfg := agent.Config{Server: cp.GatewayAddr, StateDir: state, SysfsRoot: root, CgroupRoot: filepath.Join(state, "cgroup"),
		PlainCgroupDir: true, Hardware: backend, Version: "kubelet-test", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Attest: agent.AttestConfig{Attestor: "kubelet", KubeletCert: certFile}}
	if labels != nil {
		cfg.NodeLabels, cfg.NodeLabelsChanged, cfg.NodeLabelsSource = labels.get, labels.watch, "kubernetes/node/"+host
	}
	a, err := agent.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func fmtHost(h string) string {
	b := []byte("000000000000")
	copy(b[12-min(len(h), 12):], h)
	for i, c := range b {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			b[i] = '0' + byte(i%10)
		}
	}
	return string(b)
}

// TestBcdKubeletJoin: bcd joins with its kubelet's client certificate as
// evidence, against the real control plane over mutual TLS. The tenant
// registered its cluster's CA; a certificate of that CA that is not a
// kubelet's (an administrator's) is refused, as is a kubelet's of another
// cluster and a second machine showing the same Node's certificate. The
// admitted node carries the Node's name, reports the Node's labels, and
// a pool that selects by them takes it, and lets it go when they change.
func TestBcdKubeletJoin(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := t.Context()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "gpu"}))
	require.NoError(t, err)
	cluster, otherCluster := newClusterCA(t), newClusterCA(t)
	anchor, err := admin.TrustAnchors.Create(ctx, connect.NewRequest(&apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "prod-cluster",
		Attestor: "kubelet", CertificatesPem: cluster.pem}))
	require.NoError(t, err)
	for _, name := range []string{"h100", "b200"} {
		_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: name,
			Selector: []*apiv1.SelectorRequirement{{Key: "bcd.dev/pool", Operator: "In", Values: []string{name}}}}))
		require.NoError(t, err)
	}
	token := func() string {
		tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "gpu", Attestor: "kubelet"}))
		require.NoError(t, err)
		return tok.Msg.GetToken()
	}

	// Not a kubelet: an administrator's certificate from the cluster CA.
	adminCert := cluster.client(t, t.TempDir(), "kubernetes-admin", "system:masters")
	err = kubeletMachine(t, cp, "gpu-node-1", adminCert, nil).Join(ctx, token())
	require.ErrorContains(t, err, "not a kubelet's")
	// A kubelet's group but another user (a kubelet may not be named so).
	err = kubeletMachine(t, cp, "gpu-node-1", cluster.client(t, t.TempDir(), "system:kube-proxy", "system:nodes"), nil).Join(ctx, token())
	require.ErrorContains(t, err, "not a kubelet's")
	// A kubelet of a cluster the tenant did not register.
	err = kubeletMachine(t, cp, "gpu-node-1", otherCluster.client(t, t.TempDir(), "system:node:gpu-node-1", "system:nodes"), nil).Join(ctx, token())
	require.ErrorContains(t, err, "does not chain to a registered CA")

	kubeletCert := cluster.client(t, t.TempDir(), "system:node:gpu-node-1", "system:nodes")
	labels := &nodeLabels{labels: map[string]string{"bcd.dev/pool": "h100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, changed: make(chan struct{})}
	a := kubeletMachine(t, cp, "host-7f3a", kubeletCert, labels)
	require.NoError(t, a.Join(ctx, token()))
	require.Equal(t, "kubelet", pki.AttestorOf(a.Certificate()))
	getNode := func() *apiv1.Node {
		n, err := admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: "acme", Node: a.NodeID()}))
		require.NoError(t, err)
		return n.Msg.GetNode()
	}
	n := getNode()
	require.Equal(t, "gpu-node-1", n.GetName(), "the node is named after its Kubernetes Node, not the host name")
	require.Equal(t, "kubelet", n.GetAttestor())
	require.Equal(t, "kubelet:gpu-node-1", n.GetAttestedId())
	require.Equal(t, anchor.Msg.GetTrustAnchor().GetId(), n.GetTrustAnchorId())

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- a.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	bctest.WaitFor(t, "the node in pool h100 by its Node's label", func() bool { return getNode().GetPool() == "h100" })
	require.Equal(t, "NVIDIA-H100-80GB-HBM3", getNode().GetDerivedLabels()["nvidia.com/gpu.product"])

	// The Node is relabelled: bcd sends its inventory again and the node
	// moves to the pool that now selects it.
	labels.set(map[string]string{"bcd.dev/pool": "b200"})
	bctest.WaitFor(t, "the node moved to pool b200", func() bool { return getNode().GetPool() == "b200" })

	// Another machine with a copy of that kubelet's key is not a second
	// gpu-node-1.
	err = kubeletMachine(t, cp, "host-9c1e", kubeletCert, nil).Join(ctx, token())
	require.ErrorContains(t, err, "already joined as node "+a.NodeID())
}
