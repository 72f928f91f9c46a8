package reservation

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/execrelay"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// Bounds on reservations.exec.
const (
	// MaxExecArgs is how many arguments (the program included) a command
	// line may have.
	MaxExecArgs = 1024
	// MaxExecArgvBytes bounds the command line: every argument's bytes
	// plus one (its terminating NUL, as the kernel counts).
	MaxExecArgvBytes = 64 << 10
	// MaxExecAuditBytes is how much of the command line the audit row
	// keeps.
	MaxExecAuditBytes = 1 << 10
	// KindProcessExec is the command that carries it to the node.
	KindProcessExec = "process.exec"
	// CapExecIsolated is the node capability that says bcd confines
	// allocations' processes (agent.CapExecIsolated).
	CapExecIsolated = "exec.isolated"
)

// requireIsolation refuses an exec on a node that does not confine its
// processes when the reservation's pool is shared beyond its owner: there
// the process would run beside other tenants' work as root.
func requireIsolation(ctx context.Context, q store.Querier, cur *Reservation) error {
	p, err := pool.Get(ctx, q, "", cur.PoolID)
	if err != nil {
		return fmt.Errorf("read the reservation's pool: %w", err)
	}
	shared := p.Offer == pool.OfferAll || p.Offer == pool.OfferTenants || p.TenantID != cur.TenantID
	if !shared {
		return nil
	}
	caps, err := nodeCapabilities(ctx, q, cur.NodeID)
	if err != nil {
		return fmt.Errorf("read node %s: %w", cur.NodeID, err)
	}
	if slices.Contains(caps, CapExecIsolated) {
		return nil
	}
	return envelope.Errorf(envelope.CodeExecNotIsolated,
		"pool %s is shared beyond its owner and node %s does not confine processes (it lacks capability %s): exec runs only on nodes that do, or in a pool of the owner's alone",
		p.Name, cur.NodeID, CapExecIsolated)
}

// ExecPath is what reservations.exec needs of the fleet: the node's session
// on this replica, the relay of its output, and the command's row.
type ExecPath interface {
	// Connected reports whether this replica holds nodeID's session: the
	// output of a process reaches only the replica the node talks to.
	Connected(nodeID string) bool
	// SessionReplica returns the URL of the replica that holds nodeID's
	// session when that is another replica this one can reach over the
	// replicas' mutual TLS; "" when it is this one, none, or this replica
	// forwards nothing (one replica, SQLite, no PKI).
	SessionReplica(ctx context.Context, nodeID string) (string, error)
	// Subscribe receives a command's output and end.
	Subscribe(commandID string) *execrelay.Subscription
	// Cancel cancels the command (the agent kills the process group).
	Cancel(ctx context.Context, commandID, message string) error
	// Ended returns the command's end when its row is final (the agent's
	// report reached another replica, or the command expired), else nil.
	Ended(ctx context.Context, commandID string) (*execrelay.Exit, error)
	// EndAllocation cancels, in tx, the processes still running in an
	// allocation that ends, and wakes the node's session once tx commits.
	EndAllocation(ctx context.Context, tx store.Tx, nodeID, allocationID string) error
}

func validateArgv(vs *envelope.Violations, argv []string) {
	switch {
	case len(argv) == 0:
		vs.Add("argv", "is required: give the program and its arguments after --")
		return
	case len(argv) > MaxExecArgs:
		vs.Add("argv", "has %d arguments; at most %d", len(argv), MaxExecArgs)
		return
	case argv[0] == "":
		vs.Add("argv[0]", "is required: the program to run")
	}
	total := 0
	for i, a := range argv {
		total += len(a) + 1
		if strings.IndexByte(a, 0) >= 0 {
			vs.Add(fmt.Sprintf("argv[%d]", i), "contains a NUL byte, which no command line can carry")
		} else if !utf8.ValidString(a) {
			vs.Add(fmt.Sprintf("argv[%d]", i), "is not valid UTF-8")
		}
	}
	if total > MaxExecArgvBytes {
		vs.Add("argv", "is %d bytes; at most %d (64 KiB)", total, MaxExecArgvBytes)
	}
}

// CommandLine is argv as the audit log keeps it: each argument quoted where
// a shell would need it (control characters escaped), at most
// MaxExecAuditBytes, cut at a character boundary with what was left out.
func CommandLine(argv []string) string {
	var b strings.Builder
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !strings.ContainsRune("-_./=:,@+", r) && (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9')
		}) < 0 {
			b.WriteString(a)
		} else {
			b.WriteString(strconv.QuoteToASCII(a))
		}
	}
	s := b.String()
	if len(s) <= MaxExecAuditBytes {
		return s
	}
	cut := MaxExecAuditBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d more bytes)", s[:cut], len(s)-cut)
}

// Exec runs a process in an active reservation's cgroup on its node and
// streams its output. It is a mutation (reservations.exec, one decision,
// audited with the command line) that writes a process.exec command; the
// call then relays what the node's session reports until the process ends.
// Ending the call cancels the command, and the agent kills the process
// group. The output reaches only the replica that holds the node's
// session, so a call that reaches another replica is forwarded there whole,
// before any decision: that replica decides, runs and relays it.
func (s *Service) Exec(ctx context.Context, req *connect.Request[apiv1.ExecReservationRequest], stream *connect.ServerStream[apiv1.ExecReservationResponse]) error {
	msg := req.Msg
	ep := s.engine.Exec
	if url, nodeID, err := s.sessionReplica(ctx, msg.GetTenant(), msg.GetReservation()); err != nil || url != "" {
		if err != nil {
			return s.env.Fail(ctx, err)
		}
		return placer.ForwardStream(ctx, &s.engine.placers, url, envelope.InfoFrom(ctx).Procedure, "node "+nodeID+"'s session", req, stream)
	}
	// A refusal names the tenant the request named, as for unary calls.
	ctx = envelope.WithRequestedTenant(ctx, msg)
	var (
		r   ref
		sub *execrelay.Subscription
	)
	closeSub := func() {
		if sub != nil {
			sub.Close()
			sub = nil
		}
	}
	res, err := envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.ExecStarted]{
		Validate: func() error {
			var vs envelope.Violations
			validateRef(&vs, msg.GetTenant(), msg.GetReservation())
			validateArgv(&vs, msg.GetArgv())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookup(ctx, q, msg.GetTenant(), msg.GetReservation())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.ExecStarted, error) {
			if err := r.notFound(msg.GetTenant(), msg.GetReservation()); err != nil {
				return nil, err
			}
			cur, err := getForUpdate(ctx, tx.Tx, r.r.ID)
			if err != nil {
				return nil, err
			}
			now := tx.Now()
			switch {
			case cur.State != StateActive:
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "reservation %s is %s; a process runs only in an active reservation", cur.ID, cur.State)
			case cur.Binding != BindingNode || cur.NodeID == "":
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "reservation %s is bound by %s, not by the node agent: there is no cgroup to run a process in", cur.ID, cur.Binding)
			case !cur.EndsAt.After(now):
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "reservation %s ended at %s", cur.ID, cur.EndsAt.Format(time.RFC3339))
			case ep == nil || !ep.Connected(cur.NodeID):
				return nil, envelope.Errorf(envelope.CodeUnavailable, "node %s has no session on this replica (it is unreachable, or its session is moving to another replica): retry", cur.NodeID)
			}
			if err := requireIsolation(ctx, tx.Tx, &cur); err != nil {
				return nil, err
			}
			id, err := s.engine.Commands.Send(ctx, tx.Tx, Command{
				TenantID: cur.TenantID, NodeID: cur.NodeID, Kind: KindProcessExec,
				Params: map[string]any{
					"allocation_id": cur.ID, "argv": anySlice(msg.GetArgv()), "gpu_uuids": anySlice(cur.Placement.GPUUUIDs),
					"omit_gpu_env": msg.GetOmitGpuEnv(),
				},
				// Each exec is a command of its own; a replayed request runs again.
				IdempotencyKey: envelope.NewID("exe", now), CreatedBy: tx.Caller().Principal.ID,
				// The reservation's end cancels it (an extension moves the
				// end); the deadline is the backstop past the longest
				// lifetime a reservation may have.
				TTL: cur.StartsAt.Add(pool.MaxDurationSeconds*time.Second + time.Hour).Sub(now), Time: now,
			})
			if err != nil {
				return nil, fmt.Errorf("send process.exec: %w", err)
			}
			// Subscribed before the command commits: the node cannot
			// report on it earlier.
			closeSub()
			sub = ep.Subscribe(id)
			tx.SetAuditDetail(CommandLine(msg.GetArgv()))
			// The command line stays in the audit row; the event, which
			// every watcher of the tenant sees, names only the command.
			tx.Emit(event("reservation.exec", &cur, map[string]any{"command_id": id}))
			return &apiv1.ExecStarted{CommandId: id, NodeId: cur.NodeID}, nil
		},
	})
	if err != nil {
		closeSub()
		return err
	}
	defer closeSub()
	started := res.Msg
	cancel := func(why string) {
		cctx, done := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer done()
		if err := ep.Cancel(cctx, started.GetCommandId(), why); err != nil {
			s.env.Logger().Warn("cancel of an exec failed", "command", started.GetCommandId(), "err", err)
		}
	}
	send := func(m *apiv1.ExecReservationResponse) error {
		if err := stream.Send(m); err != nil {
			cancel("the caller's stream ended")
			return err
		}
		return nil
	}
	if err := send(&apiv1.ExecReservationResponse{Event: &apiv1.ExecReservationResponse_Started{Started: started}}); err != nil {
		return err
	}
	output := func(ev execrelay.Event) error {
		return send(&apiv1.ExecReservationResponse{Event: &apiv1.ExecReservationResponse_Output{Output: &apiv1.ExecOutput{Stream: ev.Stream, Data: ev.Data}}})
	}
	// finish sends what is left of the output, then the exit.
	finish := func(e *execrelay.Exit) error {
		for {
			select {
			case ev := <-sub.Output():
				if err := output(ev); err != nil {
					return err
				}
				continue
			default:
			}
			break
		}
		return send(&apiv1.ExecReservationResponse{Event: &apiv1.ExecReservationResponse_Exit{Exit: ExitProto(e, sub.Dropped())}})
	}
	poll := time.NewTicker(s.poll)
	defer poll.Stop()
	for {
		select {
		case ev := <-sub.Output():
			if err := output(ev); err != nil {
				return err
			}
		case e := <-sub.Exit():
			return finish(e)
		case <-poll.C:
			e, err := ep.Ended(ctx, started.GetCommandId())
			if err != nil && ctx.Err() == nil {
				s.env.Logger().Warn("reading an exec's command", "command", started.GetCommandId(), "err", err)
			}
			if e != nil {
				return finish(e)
			}
		case <-ctx.Done():
			cancel("the caller went away")
			return ctx.Err()
		}
	}
}

// sessionReplica returns the URL of the replica that holds the session of
// the node of the reservation tenantRef and id name, when another replica
// holds it (with the node), or "" when this replica answers the call
// itself: it holds the session, the reservation is not found or has no
// node, or this replica forwards nothing. Nothing here is decided: the
// replica that answers authorizes the call.
func (s *Service) sessionReplica(ctx context.Context, tenantRef, id string) (url, nodeID string, err error) {
	ep := s.engine.Exec
	if ep == nil || s.env.DB().PgxPool() == nil {
		return "", "", nil
	}
	if err := s.env.DB().Read(ctx, func(ctx context.Context, tx store.Tx) error {
		r, err := lookup(ctx, tx, tenantRef, id)
		nodeID = r.r.NodeID
		return err
	}); err != nil || nodeID == "" {
		return "", "", err
	}
	url, err = ep.SessionReplica(ctx, nodeID)
	return url, nodeID, err
}

// ExitProto is a command's end as the API says it.
func ExitProto(e *execrelay.Exit, relayDropped uint64) *apiv1.ExecExit {
	out := &apiv1.ExecExit{State: e.State, ExitCode: -1, Message: e.Message, FailureCode: e.FailureCode, DroppedBytes: relayDropped}
	r := e.Result
	if v, ok := r["exit_code"].(float64); ok {
		out.ExitCode = int32(v)
	}
	if v, ok := r["signal"].(string); ok {
		out.Signal = v
	}
	if v, ok := r["dropped_bytes"].(float64); ok && v > 0 {
		out.DroppedBytes += uint64(v)
	}
	if v, ok := r["cgroup"].(string); ok {
		out.Cgroup = v
	}
	if v, ok := r["cgroup_entered"].(bool); ok {
		out.CgroupEntered = v
	}
	if v, ok := r["cgroup_note"].(string); ok {
		out.CgroupNote = v
	}
	return out
}
