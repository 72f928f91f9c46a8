package agent_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/agent"
)

func TestParseServers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "gw.example:7443", want: []string{"gw.example:7443"}},
		{in: "10.0.0.1:7443, 10.0.0.2:7443", want: []string{"10.0.0.1:7443", "10.0.0.2:7443"}},
		{in: "[::1]:7443,gw:1", want: []string{"[::1]:7443", "gw:1"}},
		{in: "", wantErr: "no gateway address"},
		{in: "gw:1,,gw:2", wantErr: "empty entry"},
		{in: "gw:1,", wantErr: "empty entry"},
		{in: "gw", wantErr: "must be HOST:PORT"},
		{in: "gw:1,gw2", wantErr: `"gw2" must be HOST:PORT`},
		{in: ":7443", wantErr: "both parts"},
	} {
		got, err := agent.ParseServers(tc.in)
		if tc.wantErr != "" {
			require.ErrorContains(t, err, tc.wantErr, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
}

// twoReplicas is two gateways of one control plane: one CA, one node id.
func twoReplicas(t *testing.T, serverCert func(*testCA) tls.Certificate) (*bundle, *fakeGateway) {
	t.Helper()
	ca := newCA(t, "test root")
	b := &bundle{stateDir: filepath.Join(t.TempDir(), "state"), cgRoot: filepath.Join(t.TempDir(), "bettercompute")}
	b.gw = newGatewayWith(t, ca, serverCert(ca))
	return b, newGatewayWith(t, ca, serverCert(ca))
}

// TestSessionMovesToNextGateway: with two gateways listed, the session
// comes up on the first; when that replica dies the agent's next session
// is on the second, with the same identity (no new join).
func TestSessionMovesToNextGateway(t *testing.T) {
	t.Parallel()
	b, second := twoReplicas(t, func(ca *testCA) tls.Certificate {
		c, _ := ca.serverCert(t)
		return c
	})
	a := b.newAgent(t, func(c *agent.Config) { c.Server = b.gw.addr + "," + second.addr })
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	cert := a.Certificate()
	run(t, a)
	b.gw.hello(t)
	bctest.WaitFor(t, "the session on the first gateway", func() bool { return a.Gateway() == b.gw.addr })

	b.gw.stop()
	second.hello(t)
	bctest.WaitFor(t, "the session on the second gateway", func() bool { return a.Gateway() == second.addr })
	require.Equal(t, cert.SerialNumber, a.Certificate().SerialNumber)
	require.Len(t, second.joinCSRs, 0)
}

// TestJoinAndSessionSkipDeadGateway: the first gateway listed is down from
// the start; join and session both go to the next one.
func TestJoinAndSessionSkipDeadGateway(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := lis.Addr().String()
	require.NoError(t, lis.Close())
	a := b.newAgent(t, func(c *agent.Config) { c.Server = dead + "," + b.gw.addr })
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t)
	bctest.WaitFor(t, "the session on the live gateway", func() bool { return a.Gateway() == b.gw.addr })
}

// TestGatewayNameResolvesToSeveral: one name that resolves to two
// addresses is two gateways, each verified against the name (the
// certificate holds no IP address), and the agent moves to the second
// address when the first one's gateway dies.
func TestGatewayNameResolvesToSeveral(t *testing.T) {
	t.Parallel()
	b, second := twoReplicas(t, func(ca *testCA) tls.Certificate {
		c, _ := ca.serverCertFor(t, []string{"gw.test"}, nil)
		return c
	})
	route := map[string]string{"192.0.2.1:7443": b.gw.addr, "192.0.2.2:7443": second.addr}
	a := b.newAgent(t, func(c *agent.Config) {
		c.Server = "gw.test:7443"
		c.LookupHost = func(_ context.Context, host string) ([]string, error) {
			if host != "gw.test" {
				return nil, fmt.Errorf("no such host %q", host)
			}
			return []string{"192.0.2.1", "192.0.2.2"}, nil
		}
		// The documentation addresses stand for the replicas' listeners.
		c.Dialer = func(ctx context.Context, addr string) (net.Conn, error) {
			to, ok := route[addr]
			if !ok {
				return nil, fmt.Errorf("unexpected dial to %s", addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", to)
		}
	})
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t)
	bctest.WaitFor(t, "the session on the name's first address", func() bool { return a.Gateway() == "192.0.2.1:7443" })

	b.gw.stop()
	second.hello(t)
	bctest.WaitFor(t, "the session on the name's second address", func() bool { return a.Gateway() == "192.0.2.2:7443" })
}
