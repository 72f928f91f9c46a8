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
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/pki"
)

// writeMachineCert writes a CA-issued machine certificate and key as an
// operator's provisioning would, and returns the CA's PEM.
func writeMachineCert(t *testing.T, dir string) (caPEM, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "corp machines"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "host-1"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour)}, caCert, key.Public(), caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "machine.crt"), filepath.Join(dir, "machine.key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})), certFile, keyFile
}

// TestBcdAttestedJoin: bcd's own join (agent.Join, as --attest configures
// it) against the real control plane, once per attestor: a TPM (a real
// swtpm over TCP), a machine certificate from files, a cloud instance
// document from the metadata emulator. The node's certificate and record
// say which attestor admitted it.
func TestBcdAttestedJoin(t *testing.T) {
	t.Parallel()
	sw := bctest.StartSWTPM(t)
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "gpu"}))
	require.NoError(t, err)
	md := bctest.NewMetadataService(t, bctest.InstanceIdentity{InstanceID: "i-0bcd", AccountID: "123456789012", Region: "eu-north-1"})
	caPEM, certFile, keyFile := writeMachineCert(t, t.TempDir())
	for _, a := range []*apiv1.CreateTrustAnchorRequest{
		{Tenant: "acme", Name: "ek", Attestor: "tpm", CertificatesPem: string(sw.EKCAPEM)},
		{Tenant: "acme", Name: "corp", Attestor: "x509", CertificatesPem: caPEM},
		{Tenant: "acme", Name: "cloud", Attestor: "cloud", CertificatesPem: string(md.CertificatePEM), CloudAccount: "123456789012"},
	} {
		_, err := admin.TrustAnchors.Create(ctx, connect.NewRequest(a))
		require.NoError(t, err)
	}
	for i, tc := range []struct {
		attest agent.AttestConfig
		prefix string
	}{
		{agent.AttestConfig{Attestor: "tpm", TPM: sw.Addr}, "tpm:ek-sha256:"},
		{agent.AttestConfig{Attestor: "x509", X509Cert: certFile, X509Key: keyFile}, "x509:sha256:"},
		{agent.AttestConfig{Attestor: "cloud", MetadataURL: md.URL}, "cloud:123456789012/eu-north-1/i-0bcd"},
	} {
		tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "gpu", Attestor: tc.attest.Attestor}))
		require.NoError(t, err)
		root := t.TempDir()
		host := "attest-" + tc.attest.Attestor
		for rel, v := range map[string]string{"sys/class/dmi/id/product_uuid": "0c1d2e3f-0000-4000-8000-00000000000" + string(rune('1'+i)),
			"sys/class/dmi/id/product_serial": "SER-" + host, "sys/class/dmi/id/board_serial": "BRD-" + host, "proc/sys/kernel/hostname": host,
			"proc/cpuinfo": "processor\t: 0\nmodel name\t: rig cpu\n", "proc/meminfo": "MemTotal: 1048576 kB\nMemAvailable: 524288 kB"} {
			require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, rel)), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(root, rel), []byte(v+"\n"), 0o644))
		}
		state := t.TempDir()
		node, err := agent.New(agent.Config{Server: cp.GatewayAddr, StateDir: state, SysfsRoot: root, CgroupRoot: filepath.Join(state, "cgroup"),
			PlainCgroupDir: true, Version: "attest-test", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Attest: tc.attest})
		require.NoError(t, err)
		require.NoError(t, node.Join(ctx, tok.Msg.GetToken()), tc.attest.Attestor)
		require.Equal(t, tc.attest.Attestor, pki.AttestorOf(node.Certificate()))
		n, err := admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: "acme", Node: node.NodeID()}))
		require.NoError(t, err)
		require.Equal(t, tc.attest.Attestor, n.Msg.GetNode().GetAttestor())
		require.Contains(t, n.Msg.GetNode().GetAttestedId(), tc.prefix)
		require.NoError(t, node.Close())
	}
}
