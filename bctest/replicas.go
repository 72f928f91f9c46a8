package bctest

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"
)

// ServeReplicaTLS gives the replica a mutually authenticated listener for
// its peers (App.ReplicaHandler) with a certificate of the PKI's internal
// CA, and plugs in a transport that presents it, so that the replicas of a
// test bridge tunnels to each other. Call it on every replica.
func (cp *ControlPlane) ServeReplicaTLS(t testing.TB) {
	t.Helper()
	if cp.PKI == nil {
		t.Fatalf("bctest: ServeReplicaTLS needs the PKI (a Secret)")
	}
	cert, err := cp.PKI.IssueReplica(cp.App.Gateway.ReplicaID(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatalf("bctest: replica certificate: %v", err)
	}
	srv := httptest.NewUnstartedServer(cp.App.ReplicaHandler())
	srv.TLS = &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: cp.PKI.InternalCAPool(),
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	rt := &http.Transport{TLSClientConfig: &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: cp.PKI.InternalCAPool(),
	}}
	t.Cleanup(rt.CloseIdleConnections)
	if err := cp.App.SetReplicaTransport(context.Background(), rt, srv.URL); err != nil {
		t.Fatalf("bctest: replica transport: %v", err)
	}
}
