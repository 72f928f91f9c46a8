package reservation_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/store"
)

// execRun is what one exec streamed.
type execRun struct {
	started        *apiv1.ExecStarted
	stdout, stderr strings.Builder
	exit           *apiv1.ExecExit
}

// exec runs one exec to its end.
func (f *fixture) exec(t *testing.T, c *client.Client, req *apiv1.ExecReservationRequest) (*execRun, error) {
	t.Helper()
	stream, err := c.Reservations.Exec(context.Background(), connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	defer func() { _ = stream.Close() }()
	run := &execRun{}
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *apiv1.ExecReservationResponse_Started:
			run.started = ev.Started
		case *apiv1.ExecReservationResponse_Output:
			if ev.Output.GetStream() == "stderr" {
				run.stderr.Write(ev.Output.GetData())
			} else {
				run.stdout.Write(ev.Output.GetData())
			}
		case *apiv1.ExecReservationResponse_Exit:
			run.exit = ev.Exit
		}
	}
	return run, stream.Err()
}

// active books n GPUs of acme for an hour and waits until the node bound
// them.
func (f *fixture) active(t *testing.T, gpus int32) *apiv1.Reservation {
	t.Helper()
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: gpus, DurationSeconds: 3600})
	return f.waitState(t, r.GetId(), "active")
}

// gpuIndexes are the node's indexes of a reservation's GPUs, as
// CUDA_VISIBLE_DEVICES must name them.
func (f *fixture) gpuIndexes(t *testing.T, r *apiv1.Reservation) string {
	t.Helper()
	var idx []string
	for _, uuid := range r.GetPlacement().GetAtoms() {
		idx = append(idx, strconv.Itoa(f.count(t, `SELECT idx FROM gpus WHERE uuid = $1`, uuid)))
	}
	require.NotEmpty(t, idx)
	return strings.Join(idx, ",")
}

// execWritten counts what an exec writes: its command, audit row and event.
type execWritten struct{ commands, audits, events int }

func (f *fixture) execWritten(t *testing.T) execWritten {
	t.Helper()
	return execWritten{
		commands: f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'process.exec'`),
		audits:   f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'reservations.exec' AND decision = 'allow'`),
		events:   f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'reservation.exec'`),
	}
}

func TestExecRunsInTheReservation(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	r := f.active(t, 2)
	want := f.gpuIndexes(t, r)

	f.cp.Authz.Reset()
	argv := []string{"sh", "-c", "echo $CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES; cat /proc/self/cgroup; echo oops >&2; exit 3"}
	run, err := f.exec(t, f.member, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: r.GetId(), Argv: argv})
	require.NoError(t, err)
	require.Equal(t, 1, f.cp.Authz.CallsFor("reservations.exec"), "one decision")
	require.Equal(t, 1, f.cp.Authz.Calls(), "and no other")

	require.NotNil(t, run.started)
	require.Equal(t, r.GetPlacement().GetNodeId(), run.started.GetNodeId())
	lines := strings.Split(strings.TrimSpace(run.stdout.String()), "\n")
	require.Equal(t, want+" "+want, lines[0], "the reserved GPUs by index, for CUDA and the NVIDIA runtime")
	require.Equal(t, "oops\n", run.stderr.String())

	require.NotNil(t, run.exit)
	require.Equal(t, "succeeded", run.exit.GetState())
	require.Equal(t, int32(3), run.exit.GetExitCode())
	require.Equal(t, filepath.Join(f.sim.Daemons[0].CgroupRoot(), r.GetId()), run.exit.GetCgroup())
	// The simulated node's cgroup root is a plain directory: the exit says
	// the process ran outside it instead of pretending.
	require.False(t, run.exit.GetCgroupEntered())
	require.Contains(t, run.exit.GetCgroupNote(), "not on a cgroup v2 filesystem")

	var detail, state, result string
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT detail FROM audit_log WHERE action = 'reservations.exec' AND resource_id = $1`, r.GetId()).Scan(&detail); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT state, result FROM commands WHERE id = $1`, run.started.GetCommandId()).Scan(&state, &result)
	}))
	require.Equal(t, reservation.CommandLine(argv), detail)
	require.Equal(t, `sh -c "echo $CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES; cat /proc/self/cgroup; echo oops >&2; exit 3"`, detail)
	require.Equal(t, "succeeded", state)
	require.Contains(t, result, `"exit_code":3`)
	// A simulated node runs the process in its own cgroup; confined (bcd
	// runs as root here), the process's cgroup namespace is rooted there.
	cgroupLine := "0::" + selfCgroup(t)
	if strings.Contains(result, `"confined":true`) {
		cgroupLine = "0::/"
	}
	require.Contains(t, lines[1:], cgroupLine, "the process's cgroup (v2 line)")

	// Without the GPU environment.
	run, err = f.exec(t, f.member, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: r.GetId(), OmitGpuEnv: true,
		Argv: []string{"sh", "-c", `echo "[$CUDA_VISIBLE_DEVICES]"`}})
	require.NoError(t, err)
	require.Equal(t, "[]\n", run.stdout.String())
	require.Equal(t, int32(0), run.exit.GetExitCode())

	// A program that does not exist fails to start, with its reason.
	run, err = f.exec(t, f.member, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: r.GetId(), Argv: []string{"no-such-program-here"}})
	require.NoError(t, err)
	require.Equal(t, "failed", run.exit.GetState())
	require.Equal(t, "EXEC_START_FAILED", run.exit.GetFailureCode())
	require.Contains(t, run.exit.GetMessage(), "not found")
}

// selfCgroup is this process's cgroup v2 path: a simulated node runs
// processes in its own.
func selfCgroup(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p
		}
	}
	t.Fatalf("no cgroup v2 line in /proc/self/cgroup: %q", b)
	return ""
}

func TestExecCancelKillsTheProcessGroup(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	r := f.active(t, 1)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The shell prints its pid and starts a sleep in its group: both must go.
	sleep := bctest.UniqueSleep()
	stream, err := f.member.Reservations.Exec(ctx, connect.NewRequest(&apiv1.ExecReservationRequest{Tenant: "acme", Reservation: r.GetId(),
		Argv: []string{"sh", "-c", sleep + " & echo $$ $!; wait"}}))
	require.NoError(t, err)
	require.True(t, stream.Receive(), "started: %v", stream.Err())
	cmdID := stream.Msg().GetStarted().GetCommandId()
	require.NotEmpty(t, cmdID)
	var out strings.Builder
	for !strings.Contains(out.String(), "\n") {
		require.True(t, stream.Receive(), "output: %v", stream.Err())
		out.Write(stream.Msg().GetOutput().GetData())
	}
	require.Len(t, strings.Fields(out.String()), 2)
	// The printed pids are the process's own PID namespace's when bcd
	// confines it: the host's are found by command line (the shell's and
	// the sleep's).
	pids := bctest.WaitPIDs(t, sleep, 2)

	cancel() // the client's Ctrl-C
	for _, pid := range pids {
		bctest.WaitFor(t, fmt.Sprintf("process %d gone", pid), func() bool { return !bctest.PIDAlive(pid) })
	}
	f.eventually(t, "the command canceled", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM commands WHERE id = $1 AND state = 'canceled'`, cmdID) == 1
	})
	// The node keeps working: another exec runs at once.
	run, err := f.exec(t, f.member, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: r.GetId(), Argv: []string{"true"}})
	require.NoError(t, err)
	require.Equal(t, "succeeded", run.exit.GetState())
}

func TestExecRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	active := f.active(t, 1)
	later := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600,
		StartTime: timestamppb.New(f.cp.Clock.Now().Add(2 * time.Hour))})
	require.Equal(t, "placed", later.GetState())
	before := f.execWritten(t)

	refused := func(t *testing.T, c *client.Client, req *apiv1.ExecReservationRequest, decisions int) error {
		t.Helper()
		f.cp.Authz.Reset()
		run, err := f.exec(t, c, req)
		require.Error(t, err, "ran: %+v", run)
		require.Equal(t, decisions, f.cp.Authz.Calls(), "decisions")
		require.Equal(t, before, f.execWritten(t), "nothing written")
		return err
	}

	t.Run("not active", func(t *testing.T) {
		err := refused(t, f.member, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: later.GetId(), Argv: []string{"true"}}, 1)
		require.Equal(t, "FAILED_PRECONDITION", client.Code(err))
		require.Contains(t, err.Error(), "is placed; a process runs only in an active reservation")
	})
	t.Run("ended", func(t *testing.T) {
		gone := f.active(t, 1)
		_, err := f.member.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: gone.GetId()}))
		require.NoError(t, err)
		err = refused(t, f.member, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: gone.GetId(), Argv: []string{"true"}}, 1)
		require.Equal(t, "FAILED_PRECONDITION", client.Code(err))
		require.Contains(t, err.Error(), "is released")
	})
	t.Run("another tenant's", func(t *testing.T) {
		// Through its own tenant: not found, as if it did not exist.
		err := refused(t, f.evil, &apiv1.ExecReservationRequest{Tenant: "other", Reservation: active.GetId(), Argv: []string{"true"}}, 1)
		require.Equal(t, "NOT_FOUND", client.Code(err))
		missing := "rsv_" + strings.Repeat("0", len(active.GetId())-4)
		errMissing := refused(t, f.evil, &apiv1.ExecReservationRequest{Tenant: "other", Reservation: missing, Argv: []string{"true"}}, 1)
		require.Equal(t, strings.ReplaceAll(err.Error(), active.GetId(), missing), errMissing.Error())
		// Naming acme: the same refusal for a real and a made-up id.
		err = refused(t, f.evil, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: active.GetId(), Argv: []string{"true"}}, 1)
		errMissing = refused(t, f.evil, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: missing, Argv: []string{"true"}}, 1)
		require.Equal(t, client.Code(errMissing), client.Code(err))
		require.Equal(t, errMissing.Error(), err.Error())
	})
	t.Run("bad input", func(t *testing.T) {
		huge := make([]string, 16)
		for i := range huge {
			huge[i] = strings.Repeat("x", 64<<10) // 1 MiB in all
		}
		many := make([]string, reservation.MaxExecArgs+1)
		for i := range many {
			many[i] = "a"
		}
		for name, c := range map[string]struct {
			argv  []string
			field string
		}{
			"empty":        {nil, "argv"},
			"no program":   {[]string{"", "x"}, "argv[0]"},
			"1 MiB":        {huge, "argv"},
			"1 MiB in one": {[]string{"echo", strings.Repeat("y", 1<<20)}, "argv"},
			"too many":     {many, "argv"},
			"NUL":          {[]string{"echo", "a\x00b"}, "argv[1]"},
		} {
			t.Run(name, func(t *testing.T) {
				err := refused(t, f.member, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: active.GetId(), Argv: c.argv}, 0)
				requireViolation(t, err, c.field)
			})
		}
	})
}

func TestCommandLine(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		argv []string
		want string
	}{
		{[]string{"nvidia-smi", "-L"}, "nvidia-smi -L"},
		{[]string{"sh", "-c", "echo $HOME"}, `sh -c "echo $HOME"`},
		{[]string{"printf", "a\x1b[2Jb\n"}, `printf "a\x1b[2Jb\n"`},
		{[]string{"echo", ""}, `echo ""`},
		{[]string{"echo", "héllo"}, `echo "h\u00e9llo"`},
	} {
		require.Equal(t, c.want, reservation.CommandLine(c.argv))
	}
	long := reservation.CommandLine([]string{"echo", strings.Repeat("z", 4000)})
	require.LessOrEqual(t, len(long), reservation.MaxExecAuditBytes+len("… (99999 more bytes)"))
	require.True(t, strings.HasSuffix(long, "… (2981 more bytes)"), long)
}

func TestExecEndsWithTheReservation(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	r := f.active(t, 1)
	ctx := context.Background()
	sleep := bctest.UniqueSleep()
	stream, err := f.member.Reservations.Exec(ctx, connect.NewRequest(&apiv1.ExecReservationRequest{Tenant: "acme", Reservation: r.GetId(),
		Argv: []string{"sh", "-c", "echo $$; exec " + sleep}}))
	require.NoError(t, err)
	defer func() { _ = stream.Close() }()
	require.True(t, stream.Receive(), "started: %v", stream.Err())
	require.True(t, stream.Receive(), "output: %v", stream.Err())
	pid := bctest.WaitPIDs(t, sleep, 1)[0]

	// An extension moves the end and keeps the process.
	_, err = f.member.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{Tenant: "acme", Reservation: r.GetId(), ExtendSeconds: 600}))
	require.NoError(t, err)
	require.True(t, bctest.PIDAlive(pid))

	// The release ends it: the process is killed and the call ends with the
	// exit.
	_, err = f.member.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: r.GetId()}))
	require.NoError(t, err)
	var exit *apiv1.ExecExit
	for stream.Receive() {
		if e := stream.Msg().GetExit(); e != nil {
			exit = e
		}
	}
	require.NoError(t, stream.Err())
	require.NotNil(t, exit)
	require.Equal(t, "canceled", exit.GetState())
	require.Equal(t, "the reservation ended", exit.GetMessage())
	bctest.WaitFor(t, fmt.Sprintf("process %d gone", pid), func() bool { return !bctest.PIDAlive(pid) })
}

// TestExecNeedsIsolationOnASharedPool: once the pool is offered beyond its
// owner, exec runs only on a node that advertises exec.isolated; a
// simulated node does not, and the refusal writes nothing.
func TestExecNeedsIsolationOnASharedPool(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	r := f.active(t, 1)
	req := &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: r.GetId(), Argv: []string{"true"}}

	// The owner's pool alone: the simulated node runs it.
	run, err := f.exec(t, f.member, req)
	require.NoError(t, err)
	require.Equal(t, "succeeded", run.exit.GetState())

	_, err = f.admin.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "acme", Pool: "h100", To: []string{"other"}}))
	require.NoError(t, err)
	before := f.execWritten(t)
	run, err = f.exec(t, f.member, req)
	require.Error(t, err, "ran: %+v", run)
	require.Equal(t, "EXEC_NOT_ISOLATED", client.Code(err))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.Contains(t, err.Error(), "pool h100 is shared beyond its owner")
	require.Contains(t, err.Error(), "lacks capability exec.isolated")
	require.Equal(t, before, f.execWritten(t), "nothing written")

	// The node as a bcd that confines processes reports itself in Hello.
	nodeID := r.GetPlacement().GetNodeId()
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		var raw string
		if err := tx.QueryRow(ctx, `SELECT capabilities FROM nodes WHERE id = $1`, nodeID).Scan(&raw); err != nil {
			return err
		}
		var caps []string
		if err := json.Unmarshal([]byte(raw), &caps); err != nil {
			return err
		}
		require.NotContains(t, caps, reservation.CapExecIsolated, "a simulated node does not advertise it")
		b, err := json.Marshal(append(caps, reservation.CapExecIsolated))
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE nodes SET capabilities = $1 WHERE id = $2`, string(b), nodeID)
		return err
	}))
	run, err = f.exec(t, f.member, req)
	require.NoError(t, err)
	require.Equal(t, "succeeded", run.exit.GetState())
}
