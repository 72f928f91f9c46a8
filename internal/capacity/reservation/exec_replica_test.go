package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/store"
)

// TestExecForwardedToSessionReplica: the node holds its session on replica
// B and the caller calls replica A. A forwards the whole call to B over
// the replicas' mutual TLS with the caller's credentials; B decides it
// once and relays the output and the exit. Another tenant hears the same
// refusal through A as through B; the caller going away cancels the
// command on B; with B gone, A answers UNAVAILABLE and writes nothing.
func TestExecForwardedToSessionReplica(t *testing.T) {
	t.Parallel()
	if os.Getenv(bctest.PostgresURLEnv) == "" {
		t.Skip("two replicas need PostgreSQL; set " + bctest.PostgresURLEnv)
	}
	var b *bctest.ControlPlane
	f := setupOn(t, 1, bctest.FakeDaemonConfig{}, func(cp *bctest.ControlPlane) *bctest.ControlPlane {
		b = cp.NewReplica(t)
		return b
	})
	a := f.cp
	ctx := context.Background()
	r := f.active(t, 1)
	nodeID := r.GetPlacement().GetNodeId()
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM nodes WHERE id = $1 AND session_owner = $2`, nodeID, b.App.Gateway.ReplicaID()),
		"the node's session is on B")
	require.False(t, a.App.Gateway.Connected(nodeID), "and not on A")

	t.Run("runs on B", func(t *testing.T) {
		before := f.execWritten(t)
		a.Authz.Reset()
		b.Authz.Reset()
		run, err := f.exec(t, f.member, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: r.GetId(),
			Argv: []string{"sh", "-c", "echo forwarded; echo oops >&2; exit 3"}})
		require.NoError(t, err)
		require.Zero(t, a.Authz.Calls(), "A decides nothing")
		require.Equal(t, 1, b.Authz.CallsFor("reservations.exec"), "B decides once")
		require.Equal(t, 1, b.Authz.Calls(), "and nothing else")
		require.Equal(t, nodeID, run.started.GetNodeId())
		require.Equal(t, "forwarded\n", run.stdout.String())
		require.Equal(t, "oops\n", run.stderr.String())
		require.NotNil(t, run.exit)
		require.Equal(t, "succeeded", run.exit.GetState())
		require.Equal(t, int32(3), run.exit.GetExitCode())
		require.Equal(t, execWritten{before.commands + 1, before.audits + 1, before.events + 1}, f.execWritten(t), "one command, audited once")
		require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'reservations.exec' AND detail = $1`,
			`sh -c "echo forwarded; echo oops >&2; exit 3"`))
	})

	t.Run("another tenant", func(t *testing.T) {
		before := f.execWritten(t)
		missing := "rsv_" + strings.Repeat("0", len(r.GetId())-4)
		for _, c := range []struct{ tenant, id string }{
			{"other", r.GetId()}, {"other", missing}, {"acme", r.GetId()}, {"acme", missing},
		} {
			var errs []error
			for _, rep := range []*bctest.ControlPlane{a, b} {
				a.Authz.Reset()
				b.Authz.Reset()
				run, err := f.exec(t, rep.Client(f.evilKey), &apiv1.ExecReservationRequest{Tenant: c.tenant, Reservation: c.id, Argv: []string{"true"}})
				require.Error(t, err, "ran: %+v", run)
				require.Equal(t, 1, a.Authz.Calls()+b.Authz.Calls(), "one decision for %s/%s", c.tenant, c.id)
				errs = append(errs, err)
			}
			require.Contains(t, []string{"NOT_FOUND", "PERMISSION_DENIED"}, client.Code(errs[0]))
			require.Equal(t, client.Code(errs[1]), client.Code(errs[0]), "%s/%s: the same code through A as through B", c.tenant, c.id)
			require.Equal(t, errs[1].Error(), errs[0].Error(), "%s/%s: the same refusal through A as through B", c.tenant, c.id)
		}
		require.Equal(t, before, f.execWritten(t), "nothing written")
	})

	t.Run("the caller going away cancels it on B", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		sleep := bctest.UniqueSleep()
		stream, err := f.member.Reservations.Exec(cctx, connect.NewRequest(&apiv1.ExecReservationRequest{Tenant: "acme", Reservation: r.GetId(),
			Argv: []string{"sh", "-c", "echo $$; exec " + sleep}}))
		require.NoError(t, err)
		require.True(t, stream.Receive(), "started: %v", stream.Err())
		cmdID := stream.Msg().GetStarted().GetCommandId()
		require.NotEmpty(t, cmdID)
		require.True(t, stream.Receive(), "output: %v", stream.Err())
		pid := bctest.WaitPIDs(t, sleep, 1)[0]
		cancel()
		f.eventually(t, "the command canceled", func() bool {
			return f.count(t, `SELECT COUNT(*) FROM commands WHERE id = $1 AND state = 'canceled'`, cmdID) == 1
		})
		bctest.WaitFor(t, fmt.Sprintf("process %d gone", pid), func() bool { return !bctest.PIDAlive(pid) })
	})

	t.Run("B gone", func(t *testing.T) {
		b.Kill(t)
		// A crashed replica leaves the node's row naming it until the
		// liveness sweep; its stopping here may have released it.
		require.NoError(t, a.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE nodes SET session_owner = $1 WHERE id = $2`, b.App.Gateway.ReplicaID(), nodeID)
			return err
		}))
		before := f.execWritten(t)
		run, err := f.exec(t, f.member, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: r.GetId(), Argv: []string{"true"}})
		require.Error(t, err, "ran: %+v", run)
		require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))
		require.Contains(t, err.Error(), "the replica that holds node "+nodeID+"'s session did not answer; retry")
		var ce *connect.Error
		require.True(t, errors.As(err, &ce))
		require.Equal(t, "1", ce.Meta().Get("Retry-After"))
		require.Equal(t, before, f.execWritten(t), "nothing written")
	})
}
