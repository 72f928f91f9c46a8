package agent_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/internal/agent"
)

func timestampAgo(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(time.Now().Add(-d)) }

func TestTokenPin(t *testing.T) {
	t.Parallel()
	pin := "ab" + hex.EncodeToString(make([]byte, 31))
	tests := []struct {
		token string
		ok    bool
	}{
		{"bcjt_" + pin + ".eyJ", true},
		{"bcjt_" + pin, false},
		{"bcjt_" + pin + ".", false},
		{"bcjt_abc.eyJ", false},
		{"xxxx_" + pin + ".eyJ", false},
		{"bcjt_" + pin[:62] + "zz.eyJ", false},
	}
	for _, tt := range tests {
		got, err := agent.TokenPin(tt.token)
		if !tt.ok {
			require.ErrorIs(t, err, agent.ErrBadToken, tt.token)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, pin, hex.EncodeToString(got))
	}
}

func TestPinVerifier(t *testing.T) {
	t.Parallel()
	root := newCA(t, "root")
	inter := &testCA{}
	ikey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	inter.key = ikey
	inter.cert = root.issue(t, &ikey.PublicKey, &x509.Certificate{
		Subject: pkix.Name{CommonName: "intermediate"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	})
	_, leaf := inter.serverCert(t)
	other := newCA(t, "other")
	_, otherLeaf := other.serverCert(t)
	ckey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	clientOnly := inter.issue(t, &ckey.PublicKey, &x509.Certificate{
		Subject: pkix.Name{CommonName: "node"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	now := time.Now
	tests := []struct {
		name  string
		pin   []byte
		chain []*x509.Certificate
		ok    bool
	}{
		{"root pinned", agent.SPKIPin(root.cert), []*x509.Certificate{leaf, inter.cert, root.cert}, true},
		{"intermediate pinned", agent.SPKIPin(inter.cert), []*x509.Certificate{leaf, inter.cert}, true},
		{"leaf pinned", agent.SPKIPin(leaf), []*x509.Certificate{leaf}, true},
		{"pin not in chain", agent.SPKIPin(root.cert), []*x509.Certificate{leaf, inter.cert}, false},
		{"wrong pin", agent.SPKIPin(other.cert), []*x509.Certificate{leaf, inter.cert, root.cert}, false},
		{"pinned cert in chain but leaf not issued by it", agent.SPKIPin(root.cert), []*x509.Certificate{otherLeaf, root.cert}, false},
		{"client-only certificate", agent.SPKIPin(root.cert), []*x509.Certificate{clientOnly, inter.cert, root.cert}, false},
		{"empty", agent.SPKIPin(root.cert), nil, false},
	}
	for _, tt := range tests {
		var raw [][]byte
		for _, c := range tt.chain {
			raw = append(raw, c.Raw)
		}
		err := agent.PinVerifier(tt.pin, now)(raw, nil)
		if tt.ok {
			require.NoError(t, err, tt.name)
		} else {
			require.Error(t, err, tt.name)
		}
	}
	// Expired at verification time.
	err = agent.PinVerifier(agent.SPKIPin(root.cert), func() time.Time { return time.Now().Add(48 * time.Hour) })([][]byte{leaf.Raw, inter.cert.Raw, root.cert.Raw}, nil)
	require.Error(t, err)
}
