package metal

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/nodesig"
)

// testCA is a node CA, or a CA an attacker made up.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "node CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return testCA{cert: cert, key: key, pool: pool}
}

// leaf issues a node certificate for nodeID and returns it with its key.
func (ca testCA) leaf(t *testing.T, nodeID string) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: nodeID},
		URIs: []*url.URL{{Scheme: "spiffe", Host: "td", Path: "/node/" + nodeID}}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	require.NoError(t, err)
	return der, key
}

// report is what the gateway keeps for a node's signed final update.
func report(t *testing.T, certDER []byte, key *ecdsa.PrivateKey, signAs, commandID string, state agentv1.CommandState, result map[string]any) fleet.NodeReport {
	t.Helper()
	res, err := structpb.NewStruct(result)
	require.NoError(t, err)
	u := &agentv1.CommandUpdate{CommandId: commandID, State: state, Result: res}
	require.NoError(t, nodesig.Sign(key, "td", signAs, u))
	signed, err := nodesig.Bytes("td", signAs, u)
	require.NoError(t, err)
	return fleet.NodeReport{NodeID: "nod_site", Kind: "command.succeeded", Subject: commandID, CertDER: certDER, Signed: signed,
		Signature: u.GetNodeSignature(), CreateTime: time.Now()}
}

// TestRotationReportChecks: only the site agent's own signed success for
// this command and this pending credential lets a new password become
// current; a report from a made-up CA, for another node, command or
// credential, a failure, a success without a verified login or a
// signature that does not verify is refused.
func TestRotationReportChecks(t *testing.T) {
	t.Parallel()
	ca, forger := newTestCA(t), newTestCA(t)
	der, key := ca.leaf(t, "nod_site")
	otherDER, otherKey := ca.leaf(t, "nod_other")
	forgedDER, forgedKey := forger.leaf(t, "nod_site")
	ok := map[string]any{"login_verified": true, "pending_ref": "bmccred_new"}
	succeeded := agentv1.CommandState_COMMAND_STATE_SUCCEEDED

	require.NoError(t, checkRotationReport(report(t, der, key, "nod_site", "cmd_1", succeeded, ok), ca.pool, "nod_site", "cmd_1", "bmccred_new"))

	tampered := report(t, der, key, "nod_site", "cmd_1", succeeded, ok)
	tampered.Signature[len(tampered.Signature)-1] ^= 1
	for _, tt := range []struct {
		name string
		rep  fleet.NodeReport
		want string
	}{
		{"a CA the control plane never issued from", report(t, forgedDER, forgedKey, "nod_site", "cmd_1", succeeded, ok), "does not chain"},
		{"another node's certificate", report(t, otherDER, otherKey, "nod_site", "cmd_1", succeeded, ok), "does not name node nod_site"},
		{"signed as another node", report(t, der, key, "nod_other", "cmd_1", succeeded, ok), "signed as node nod_other"},
		{"another command", report(t, der, key, "nod_site", "cmd_2", succeeded, ok), "about command cmd_2"},
		{"another credential", report(t, der, key, "nod_site", "cmd_1", succeeded, map[string]any{"login_verified": true, "pending_ref": "bmccred_old"}), "not bmccred_new"},
		{"no verified login", report(t, der, key, "nod_site", "cmd_1", succeeded, map[string]any{"pending_ref": "bmccred_new"}), "does not say the new password logs in"},
		{"a failure", report(t, der, key, "nod_site", "cmd_1", agentv1.CommandState_COMMAND_STATE_FAILED, ok), "says COMMAND_STATE_FAILED"},
		{"a bad signature", tampered, "does not verify"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := checkRotationReport(tt.rep, ca.pool, "nod_site", "cmd_1", "bmccred_new")
			require.ErrorContains(t, err, tt.want)
		})
	}
}
