package agent

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/cgroups"
	"github.com/better-compute/better-compute/internal/agent/ramdisk"
	"github.com/better-compute/better-compute/internal/cmdsig"
)

// Command kinds bcd applies.
const (
	KindInventoryRefresh  = "inventory.refresh"
	KindNodeDrain         = "node.drain"
	KindAllocationBind    = "allocation.bind"
	KindAllocationRelease = "allocation.release"
	KindProcessExec       = "process.exec"
	KindGPUReset          = "gpu.reset"
	KindNodeReboot        = "node.reboot"
)

// Failure codes in CommandUpdate.failure_code.
const (
	FailUnknownKind      = "UNKNOWN_KIND"
	FailInvalidParams    = "INVALID_PARAMS"
	FailDeadlineExceeded = "DEADLINE_EXCEEDED"
	FailCgroupWrite      = "CGROUP_WRITE_FAILED"
	FailInventory        = "INVENTORY_FAILED"
	FailInterrupted      = "INTERRUPTED"
	FailStaleSeq         = "STALE_SEQ"
	FailPersist          = "STATE_WRITE_FAILED"
	FailInjected         = "INJECTED"
	FailExecStart        = "EXEC_START_FAILED"
	FailNotBound         = "ALLOCATION_NOT_BOUND"
	// FailWrongMode: a node command sent to a ramdisk, or a ramdisk
	// command to a node.
	FailWrongMode = "WRONG_MODE"
	FailRamdisk   = "RAMDISK_FAILED"
)

type runningCommand struct {
	id     string
	cancel context.CancelFunc
}

type commandError struct {
	code string
	err  error
}

func (e *commandError) Error() string { return e.code + ": " + e.err.Error() }
func (e *commandError) Unwrap() error { return e.err }

// FailureCode is the code the command fails with (InstanceRunner errors
// built with CommandError keep theirs).
func (e *commandError) FailureCode() string { return e.code }

func fail(code string, err error) error { return &commandError{code: code, err: err} }

// outcome is what applying a command produced beyond its final state.
type outcome struct {
	result *structpb.Struct
	extra  []*agentv1.AgentMessage // sent after the final update
}

func (a *Agent) commandLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-a.queue:
			a.handle(ctx, c)
		}
	}
}

func (a *Agent) sendOrLog(m *agentv1.AgentMessage) bool {
	s := a.currentSession()
	if s == nil {
		return false
	}
	if err := s.send(m); err != nil {
		a.log.Warn("send", "err", err)
		return false
	}
	return true
}

func update(u *agentv1.CommandUpdate) *agentv1.AgentMessage {
	return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_CommandUpdate{CommandUpdate: u}}
}

// handle applies c at most once: a command already applied (by seq or id)
// gets its recorded final update again, without running. A process.exec
// runs on a goroutine of its own, so a long process never holds up the
// node's other commands; so does an instance command, in order with the
// other commands for the same instance.
func (a *Agent) handle(ctx context.Context, c *agentv1.Command) {
	a.mu.Lock()
	if rec := a.cmds.find(c.GetSeq(), c.GetId()); rec != nil && (rec.Seq == c.GetSeq() || a.cmdTrust == nil) {
		a.mu.Unlock()
		a.resend(rec)
		return
	}
	if a.execs[c.GetId()] != nil {
		// Redelivered while it runs: its final update comes when it ends.
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	// Nothing is applied, or recorded as applied, before the signature
	// verifies: a row the control plane did not sign is refused with why,
	// and its sequence number stays unused.
	if err := a.verifyCommand(c); err != nil {
		a.log.Warn("refused a command whose signature does not verify", "seq", c.GetSeq(), "id", c.GetId(), "kind", c.GetKind(), "err", err)
		a.metrics.commandsRefused.WithLabelValues(cmdsig.Code(err)).Inc()
		a.sendOrLog(update(&agentv1.CommandUpdate{CommandId: c.GetId(), Seq: c.GetSeq(), State: agentv1.CommandState_COMMAND_STATE_FAILED,
			FailureCode: cmdsig.Code(err), Message: err.Error()}))
		return
	}
	a.mu.Lock()
	if rec := a.cmds.find(c.GetSeq(), c.GetId()); rec != nil {
		a.mu.Unlock()
		a.resend(rec)
		return
	}
	if c.GetSeq() <= a.cmds.LastAppliedSeq {
		a.mu.Unlock()
		a.log.Warn("command older than last applied and not in the log", "seq", c.GetSeq(), "id", c.GetId())
		a.sendOrLog(update(&agentv1.CommandUpdate{CommandId: c.GetId(), Seq: c.GetSeq(), State: agentv1.CommandState_COMMAND_STATE_FAILED,
			FailureCode: FailStaleSeq, Message: fmt.Sprintf("sequence %d is at or below the last applied %d", c.GetSeq(), a.LastAppliedSeq())}))
		return
	}
	canceled := a.canceled[c.GetId()]
	delete(a.canceled, c.GetId())
	injected := a.failKinds[c.GetKind()]
	cctx, cancel := context.WithCancel(ctx)
	if d := c.GetDeadline(); d != nil {
		var dcancel context.CancelFunc
		cctx, dcancel = context.WithDeadline(cctx, d.AsTime())
		stop := cancel
		cancel = func() { dcancel(); stop() }
	}
	async := isAsync(c.GetKind())
	if async {
		// Started counts as applied: a redelivery after a reconnect must
		// not start it again. The record lets a restarted bcd report it
		// INTERRUPTED.
		a.execs[c.GetId()] = &runningCommand{id: c.GetId(), cancel: cancel}
		a.cmds.Execs = append(a.cmds.Execs, inFlight{Seq: c.GetSeq(), ID: c.GetId(), Kind: c.GetKind()})
		a.cmds.LastAppliedSeq = max(a.cmds.LastAppliedSeq, c.GetSeq())
	} else {
		a.cmds.InFlight = &inFlight{Seq: c.GetSeq(), ID: c.GetId(), Kind: c.GetKind()}
		a.running1 = &runningCommand{id: c.GetId(), cancel: cancel}
	}
	// Written before applying: if bcd dies mid-command, the next start
	// reports it INTERRUPTED instead of running it again.
	perr := a.saveCommandsLocked()
	a.mu.Unlock()

	// The turn is taken here, in arrival order, not on the goroutine.
	key := ""
	if isInstanceKind(c.GetKind()) {
		key = orderKey(c)
	}
	wait, done := a.instOrder.enter(key)
	if canceled {
		// Canceled before it ran: it ends now, not after its turn.
		wait, _ = a.instOrder.enter("")
	}
	run := func() {
		defer done()
		defer cancel()
		select {
		case <-wait:
		case <-cctx.Done():
		}
		sctx, span := a.startCommandSpan(cctx, c)
		final, out := a.run(ctx, sctx, c, perr, canceled, injected)
		endCommandSpan(sctx, span, final)
		a.finish(c, final, out)
	}
	if async {
		a.execWG.Go(run)
		return
	}
	run()
}

// run applies c unless something stops it first, and returns its final
// update.
func (a *Agent) run(ctx, cctx context.Context, c *agentv1.Command, perr error, canceled bool, injected string) (*agentv1.CommandUpdate, outcome) {
	final := &agentv1.CommandUpdate{CommandId: c.GetId(), Seq: c.GetSeq()}
	var out outcome
	switch {
	case perr != nil:
		final.State, final.FailureCode, final.Message = agentv1.CommandState_COMMAND_STATE_FAILED, FailPersist, perr.Error()
	case canceled:
		final.State, final.Message = agentv1.CommandState_COMMAND_STATE_CANCELED, "canceled before it ran"
	case c.GetDeadline() != nil && !a.cfg.Clock.Now().Before(c.GetDeadline().AsTime()):
		final.State, final.FailureCode, final.Message = agentv1.CommandState_COMMAND_STATE_FAILED, FailDeadlineExceeded, "deadline passed before the command ran"
	case injected != "":
		final.State, final.FailureCode, final.Message = agentv1.CommandState_COMMAND_STATE_FAILED, injected, "failure injected for kind "+c.GetKind()
	default:
		a.sendOrLog(update(&agentv1.CommandUpdate{CommandId: c.GetId(), Seq: c.GetSeq(), State: agentv1.CommandState_COMMAND_STATE_RUNNING}))
		var err error
		out, err = a.apply(cctx, c)
		var ce *commandError
		switch {
		case err == nil:
			final.State, final.Progress, final.Result = agentv1.CommandState_COMMAND_STATE_SUCCEEDED, 100, out.result
		case errors.Is(err, context.Canceled) && ctx.Err() == nil:
			final.State, final.Message, final.Result = agentv1.CommandState_COMMAND_STATE_CANCELED, "canceled", out.result
		case errors.Is(err, context.Canceled):
			final.State, final.FailureCode, final.Message = agentv1.CommandState_COMMAND_STATE_FAILED, FailInterrupted, "bcd stopped while applying this command"
			final.Result = out.result
		case errors.Is(err, context.DeadlineExceeded):
			final.State, final.FailureCode, final.Message = agentv1.CommandState_COMMAND_STATE_FAILED, FailDeadlineExceeded, err.Error()
			final.Result = out.result
		case errors.As(err, &ce):
			final.State, final.FailureCode, final.Message = agentv1.CommandState_COMMAND_STATE_FAILED, ce.code, ce.err.Error()
		default:
			final.State, final.FailureCode, final.Message = agentv1.CommandState_COMMAND_STATE_FAILED, "INTERNAL", err.Error()
		}
	}
	if final.State != agentv1.CommandState_COMMAND_STATE_SUCCEEDED {
		out.extra = nil
	}
	return final, out
}

// finish records c's final update and reports it.
func (a *Agent) finish(c *agentv1.Command, final *agentv1.CommandUpdate, out outcome) {
	a.mu.Lock()
	if isAsync(c.GetKind()) {
		delete(a.execs, c.GetId())
		a.cmds.Execs = slices.DeleteFunc(a.cmds.Execs, func(f inFlight) bool { return f.ID == c.GetId() })
	} else {
		a.running1 = nil
		a.cmds.InFlight = nil
	}
	a.cmds.add(commandRecord{Seq: c.GetSeq(), ID: c.GetId(), Kind: c.GetKind(), Update: marshalUpdate(final)})
	if err := a.saveCommandsLocked(); err != nil {
		a.log.Error("persist command log", "err", err)
	}
	a.mu.Unlock()
	a.metrics.commands.WithLabelValues(c.GetKind(), final.GetState().String()).Inc()

	ok := a.sendOrLog(update(final))
	for _, m := range out.extra {
		ok = ok && a.sendOrLog(m)
	}
	if ok {
		a.markReported(c.GetSeq())
	}
}

func (a *Agent) markReported(seq uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rec := a.cmds.find(seq, ""); rec != nil && !rec.Reported {
		rec.Reported = true
		if err := a.saveCommandsLocked(); err != nil {
			a.log.Error("persist command log", "err", err)
		}
	}
}

func (a *Agent) resend(rec *commandRecord) {
	u, err := unmarshalUpdate(rec.Update)
	if err != nil {
		a.log.Error("resend", "err", err)
		return
	}
	if a.sendOrLog(update(u)) {
		a.markReported(rec.Seq)
	}
}

// flushUnreported sends final updates that no session carried yet (the
// gateway does not redeliver commands at or below last_applied_seq).
func (a *Agent) flushUnreported(s *session) error {
	a.mu.Lock()
	var pending []commandRecord
	for _, r := range a.cmds.Log {
		if !r.Reported {
			pending = append(pending, r)
		}
	}
	a.mu.Unlock()
	for _, r := range pending {
		u, err := unmarshalUpdate(r.Update)
		if err != nil {
			return err
		}
		if err := s.send(update(u)); err != nil {
			return fmt.Errorf("send command update: %w", err)
		}
		a.markReported(r.Seq)
	}
	return nil
}

// cancelCommand cancels a running command, remembers a cancel for one not
// yet received, and repeats the final update of one already applied.
func (a *Agent) cancelCommand(c *agentv1.CancelCommand) {
	a.mu.Lock()
	if rec := a.cmds.find(c.GetSeq(), c.GetCommandId()); rec != nil {
		a.mu.Unlock()
		a.resend(rec)
		return
	}
	if r := a.running1; r != nil && r.id == c.GetCommandId() {
		r.cancel()
	} else if r := a.execs[c.GetCommandId()]; r != nil {
		r.cancel()
	} else {
		a.canceled[c.GetCommandId()] = true
	}
	a.mu.Unlock()
}

func (a *Agent) apply(ctx context.Context, c *agentv1.Command) (outcome, error) {
	if a.cfg.Mode == agentv1.AgentMode_AGENT_MODE_RAMDISK {
		return a.applyRamdisk(ctx, c)
	}
	if ramdisk.IsKind(c.GetKind()) && c.GetKind() != KindInventoryRefresh {
		return outcome{}, fail(FailWrongMode, fmt.Errorf("command kind %q runs only in a commissioning ramdisk, not on a node", c.GetKind()))
	}
	if isInstanceKind(c.GetKind()) {
		return a.applyInstance(ctx, c)
	}
	switch c.GetKind() {
	case KindInventoryRefresh:
		sections, digest, err := a.inventory(ctx)
		if err != nil {
			return outcome{}, fail(FailInventory, err)
		}
		// Sections go out before the final update, so the gateway holds
		// the snapshot the result names.
		if s := a.currentSession(); s != nil {
			if err := a.sendInventory(s, sections, digest); err != nil {
				a.log.Warn("send inventory", "err", err)
			}
		}
		res, _ := structpb.NewStruct(map[string]any{"inventory_digest": digest})
		return outcome{result: res}, nil
	case KindNodeDrain:
		res, _ := structpb.NewStruct(map[string]any{"drained": true})
		return outcome{result: res}, nil
	case KindAllocationBind:
		da, err := deviceAssignment(c.GetParams())
		if err != nil {
			return outcome{}, fail(FailInvalidParams, err)
		}
		if err := ctx.Err(); err != nil {
			return outcome{}, err
		}
		if da.GetBinding() == BindingKubernetes {
			res, enforced, err := a.bindKube(ctx, da)
			if err != nil {
				return outcome{}, err
			}
			return outcome{result: res, extra: []*agentv1.AgentMessage{{Msg: &agentv1.AgentMessage_AllocationBound{AllocationBound: &agentv1.AllocationBound{
				AllocationId: da.GetAllocationId(), CommandId: c.GetId(), Enforced: enforced,
			}}}}}, nil
		}
		if b := da.GetBinding(); b != "" && b != "node" {
			return outcome{}, fail(FailInvalidParams, fmt.Errorf("binding: %q is neither node nor kubernetes", b))
		}
		path, enforced, err := a.bind(ctx, da)
		if err != nil {
			return outcome{}, err
		}
		res, _ := structpb.NewStruct(map[string]any{"cgroup": path})
		return outcome{result: res, extra: []*agentv1.AgentMessage{{Msg: &agentv1.AgentMessage_AllocationBound{AllocationBound: &agentv1.AllocationBound{
			AllocationId: da.GetAllocationId(), CommandId: c.GetId(), Cgroup: path, Enforced: enforced,
		}}}}}, nil
	case KindProcessExec:
		return a.exec(ctx, c)
	case KindGPUMIGConfigure:
		return a.configureMIG(ctx, c)
	case KindGPUReset:
		return a.resetGPU(ctx, c)
	case KindNodeReboot:
		return a.reboot(c)
	case KindDaemonUpgrade, KindDaemonRollback:
		if a.cfg.DaemonCommands != nil {
			res, err := a.cfg.DaemonCommands.Apply(ctx, c)
			return outcome{result: res}, err
		}
		if c.GetKind() == KindDaemonUpgrade {
			return a.upgrade(ctx, c)
		}
		return a.rollback(c)
	case KindAllocationRelease:
		id := c.GetParams().GetFields()["allocation_id"].GetStringValue()
		if id == "" {
			id = c.GetParams().GetFields()["allocationId"].GetStringValue()
		}
		if out, ok, err := a.releaseKube(c, id); ok {
			return out, err
		}
		// Release means gone: whatever still runs in the cgroup is killed
		// before the cgroup is removed and the release reported.
		killed, err := a.cg.Release(ctx, id)
		if err != nil {
			if errors.Is(err, cgroups.ErrInvalidID) {
				return outcome{}, fail(FailInvalidParams, err)
			}
			return outcome{}, fail(FailCgroupWrite, err)
		}
		// Its processes are gone: its /tmp goes, and its uid may be
		// given to the next allocation.
		if err := a.releaseFiles(id); err != nil {
			return outcome{}, fail(FailPersist, err)
		}
		res, _ := structpb.NewStruct(map[string]any{"killed_processes": killed})
		return outcome{result: res, extra: []*agentv1.AgentMessage{{Msg: &agentv1.AgentMessage_AllocationReleased{AllocationReleased: &agentv1.AllocationReleased{
			AllocationId: id, CommandId: c.GetId(), KilledProcesses: uint32(killed),
		}}}}}, nil
	}
	if a.cfg.Commands != nil {
		res, err := a.cfg.Commands.Apply(ctx, c)
		return outcome{result: res}, err
	}
	return outcome{}, fail(FailUnknownKind, fmt.Errorf("unknown command kind %q", c.GetKind()))
}

// CommandHandler applies command kinds of a mode of bcd (Config.Commands).
// Apply runs at most once per command (bcd's command log sees to it) and
// returns the command's result; an error made with CommandError carries
// its failure code, and a canceled ctx means bcd stopped or the command
// was canceled.
type CommandHandler interface {
	Apply(ctx context.Context, c *agentv1.Command) (*structpb.Struct, error)
}

// CommandError is a command failure with its failure code
// (CommandUpdate.failure_code).
func CommandError(code string, err error) error { return fail(code, err) }

// deviceAssignment decodes Command.params, the JSON form of a
// DeviceAssignment (protojson: either field-name spelling, 64-bit numbers
// as strings or numbers).
func deviceAssignment(p *structpb.Struct) (*agentv1.DeviceAssignment, error) {
	if p == nil {
		return nil, errors.New("allocation.bind needs params")
	}
	b, err := protojson.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("params: %w", err)
	}
	da := &agentv1.DeviceAssignment{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, da); err != nil {
		return nil, fmt.Errorf("params are not a DeviceAssignment: %w", err)
	}
	if da.GetAllocationId() == "" {
		return nil, errors.New("params: allocation_id is required")
	}
	return da, nil
}

// applyRamdisk runs a ramdisk command; every other kind is refused. The
// ramdisk signs wipe records with the key of its node certificate.
func (a *Agent) applyRamdisk(ctx context.Context, c *agentv1.Command) (outcome, error) {
	if !ramdisk.IsKind(c.GetKind()) {
		return outcome{}, fail(FailWrongMode, fmt.Errorf("command kind %q is not a ramdisk command: a ramdisk runs only %s",
			c.GetKind(), strings.Join(ramdisk.Kinds(), ", ")))
	}
	a.mu.Lock()
	cert := a.cert
	nodeID := a.node.NodeID
	a.mu.Unlock()
	var key crypto.Signer
	if cert != nil {
		key, _ = cert.PrivateKey.(crypto.Signer)
	}
	res, err := a.cfg.Ramdisk.Apply(ctx, c.GetKind(), c.GetParams().AsMap(), ramdisk.Identity{NodeID: nodeID, Key: key})
	if errors.Is(err, ramdisk.ErrInvalidParams) {
		return outcome{}, fail(FailInvalidParams, err)
	}
	if err != nil {
		if ctx.Err() != nil {
			return outcome{}, err
		}
		return outcome{}, fail(FailRamdisk, err)
	}
	st, err := structpb.NewStruct(res)
	if err != nil {
		return outcome{}, fail(FailRamdisk, fmt.Errorf("result: %w", err))
	}
	return outcome{result: st}, nil
}
