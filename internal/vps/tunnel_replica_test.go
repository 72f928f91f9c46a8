package vps_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/sshexec"
	"github.com/better-compute/better-compute/internal/tunnel"
)

// TestSshTunnelBridgedToSessionReplica: a ticket redeemed on one replica
// for a node whose gateway session another replica holds gets its tunnel
// through that replica, over the replicas' mutual TLS, wherever the ticket
// was issued; the guest runs the command, and the ticket opens no second
// tunnel on any replica.
func TestSshTunnelBridgedToSessionReplica(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	if !h.cp.App.DB.SupportsListener() {
		t.Skip("two replicas need PostgreSQL; set BC_TEST_POSTGRES_URL")
	}
	ctx := context.Background()
	in := h.runningInstance(t, "vm1")
	r2 := h.cp.NewReplica(t)
	h.cp.ServeReplicaTLS(t)
	r2.ServeReplicaTLS(t)

	// The node's session is on h.cp. A ticket issued there and one issued
	// on r2 both open their tunnel through r2 (a load balancer's choice).
	for _, issuer := range []*bctest.ControlPlane{h.cp, r2} {
		key, err := sshexec.NewKey()
		require.NoError(t, err)
		res, err := issuer.Client(h.acmeKey).Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: in.GetId(),
			PublicKey: key.AuthorizedKey}))
		require.NoError(t, err)
		var stdout strings.Builder
		out, err := sshexec.Run(ctx, sshexec.Params{APIURL: r2.URL, Ticket: res.Msg.GetTicket(), Key: key, Command: "echo bridged; exit 4", Stdout: &stdout})
		require.NoError(t, err)
		require.Equal(t, 4, out.ExitCode)
		require.Equal(t, sshca.HostCertValid, out.HostCert)
		require.Equal(t, "bridged\n", stdout.String())

		// Used on one replica, the ticket is used on all.
		_, err = sshexec.Run(ctx, sshexec.Params{APIURL: h.cp.URL, Ticket: res.Msg.GetTicket(), Key: key, Command: "true"})
		var refused *tunnel.RefusedError
		require.ErrorAs(t, err, &refused)
		require.Equal(t, "UNAUTHENTICATED", refused.Code)
	}
}

// TestForwardedTunnelOnlyFromReplicas: the peer endpoint refuses a caller
// without a verified client certificate, before reading its ticket.
func TestForwardedTunnelOnlyFromReplicas(t *testing.T) {
	t.Parallel()
	f := setup(t)
	srv := httptest.NewUnstartedServer(f.cp.App.ReplicaHandler())
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13, ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	_, err := tunnel.Forward(context.Background(), srv.Client().Transport, srv.URL, tunnel.Ticket{
		TenantID: "tnt_x", InstanceID: "ins_x", HostID: "ins-x", NodeID: "nod_x", Expire: f.cp.Clock.Now().Add(tunnel.TicketTTL)})
	var refused *tunnel.RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, http.StatusForbidden, refused.Status)
	require.Equal(t, "PERMISSION_DENIED", refused.Code)
}
