package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
	"github.com/better-compute/better-compute/internal/gpuhealth"
)

// GPU health: bcd polls its backend's standing findings every
// Config.HealthInterval and at each new session, and sends a status report
// with the whole set (findings_complete) when it changed; it watches XIDs
// for its lifetime and reports each as a health event. gpu.reset and
// node.reboot are the remedies the control plane's workflows send.

// Failure codes of the health commands.
const (
	// FailGPUInUse: an allocation of this node holds the GPU.
	FailGPUInUse = "GPU_IN_USE"
	// FailGPUReset: the backend could not reset the GPU.
	FailGPUReset = "GPU_RESET_FAILED"
	// FailNotSupported: this node's hardware backend cannot do it.
	FailNotSupported = "NOT_SUPPORTED"
)

// healthTimeout bounds one poll of the findings: a wedged driver does not
// hold up the next.
const healthTimeout = 10 * time.Second

// rebootWait is how long node.reboot waits for its final update to reach
// the gateway before it reboots anyway (the update is in the command log by
// then, and the next session carries it).
const rebootWait = 5 * time.Second

// heldGPUsFile, in an allocation's directory, lists the GPUs (parents of
// MIG instances included) its node binding holds; release removes it with
// the directory.
const heldGPUsFile = "gpus.json"

// findingState is the last poll's findings and when each was first seen.
type findingState struct {
	polled bool
	list   []*agentv1.HealthEvent
	since  map[string]time.Time
}

func findingKey(f *agentv1.HealthEvent) string {
	return fmt.Sprintf("%s\x00%s\x00%d\x00%d\x00%s", f.GetKind(), f.GetDevice(), f.GetGpuIndex(), f.GetCode(), f.GetSeverity())
}

func (a *Agent) healthSource() hw.HealthSource {
	src, _ := a.cfg.Hardware.(hw.HealthSource)
	return src
}

// pollFindings reads the standing findings and keeps them for the status
// reports; it reports whether the set differs from the last poll's (the
// first poll always differs). A finding keeps the time it was first seen.
func (a *Agent) pollFindings(ctx context.Context) (bool, error) {
	src := a.healthSource()
	if src == nil {
		return false, nil
	}
	a.healthMu.Lock()
	defer a.healthMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	list, err := src.Findings(ctx)
	if err != nil {
		return false, fmt.Errorf("read gpu health findings: %w", err)
	}
	now := a.cfg.Clock.Now()
	since := make(map[string]time.Time, len(list))
	var fresh []*agentv1.HealthEvent
	a.mu.Lock()
	changed := !a.findings.polled || len(list) != len(a.findings.list)
	for i, f := range list {
		k := findingKey(f)
		t, ok := a.findings.since[k]
		if !ok {
			t = now
			fresh = append(fresh, f)
		}
		since[k] = t
		f.Time = timestamppb.New(t)
		if !changed && findingKey(a.findings.list[i]) != k {
			changed = true
		}
	}
	a.findings = findingState{polled: true, list: list, since: since}
	a.mu.Unlock()
	for _, f := range fresh {
		// What takes a GPU out of placement takes it out of the
		// kubelet's offer too, as an XID does.
		a.quarantineKube(f)
	}
	return changed, nil
}

// PollHealth polls the findings now and, when they changed, sends a
// status report with them (bcd does this every Config.HealthInterval; a
// test hook).
func (a *Agent) PollHealth(ctx context.Context) error {
	changed, err := a.pollFindings(ctx)
	if err != nil {
		return err
	}
	if changed {
		a.sendStatus()
	}
	return nil
}

func (a *Agent) sendStatus() {
	a.sendOrLog(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Status{Status: a.status()}})
}

// MaxReportedFindings is how many findings one status report carries, the
// gateway's bound on the list.
const MaxReportedFindings = 64

// statusFindingsLocked adds the last poll's findings to r. More than a
// report carries (a broken NVSwitch takes every link of every GPU down)
// go most severe first, and the report says the set is not complete, so
// that the control plane clears none of those left out.
func (a *Agent) statusFindingsLocked(r *agentv1.StatusReport) {
	if !a.findings.polled {
		return
	}
	list := a.findings.list
	r.FindingsComplete = true
	if len(list) > MaxReportedFindings {
		list = slices.Clone(list)
		slices.SortStableFunc(list, func(x, y *agentv1.HealthEvent) int {
			return gpuhealth.SeverityRank(y.GetSeverity()) - gpuhealth.SeverityRank(x.GetSeverity())
		})
		list = list[:MaxReportedFindings]
		r.FindingsComplete = false
	}
	for _, f := range list {
		r.Findings = append(r.Findings, proto.CloneOf(f))
	}
	if len(r.Findings) > 0 {
		r.Health = "degraded"
	}
}

// healthLoop polls the findings every HealthInterval until ctx ends.
func (a *Agent) healthLoop(ctx context.Context) {
	if a.healthSource() == nil {
		return
	}
	t := time.NewTicker(a.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := a.PollHealth(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("gpu health not read", "err", err)
		}
	}
}

// xidLoop reports the backend's XIDs as health events until ctx ends.
func (a *Agent) xidLoop(ctx context.Context) {
	src := a.healthSource()
	if src == nil {
		return
	}
	if err := src.WatchXIDs(ctx, a.ReportHealthEvent); err != nil && ctx.Err() == nil {
		a.log.Warn("not watching GPU XIDs", "err", err)
	}
}

// resetGPU applies gpu.reset: params {"gpu": uuid}. A GPU an allocation
// holds is refused: a reset kills whatever runs on it. After the reset the
// findings are read again and reported, with the GPU's XID events gone.
func (a *Agent) resetGPU(ctx context.Context, c *agentv1.Command) (outcome, error) {
	uuid := c.GetParams().GetFields()["gpu"].GetStringValue()
	if uuid == "" {
		return outcome{}, fail(FailInvalidParams, errors.New(`gpu.reset needs params {"gpu": "<GPU UUID>"}`))
	}
	r, ok := a.cfg.Hardware.(hw.GPUResetter)
	if !ok {
		return outcome{}, fail(FailNotSupported, errors.New("this node's hardware backend cannot reset GPUs"))
	}
	// A lost GPU fails the inventory; the reset then says what it can.
	if inv, err := a.gpus(ctx); err == nil && !slices.ContainsFunc(inv.GetGpus(), func(g *agentv1.Gpu) bool { return g.GetUuid() == uuid }) {
		return outcome{}, fail(FailInvalidParams, fmt.Errorf("gpu: %s is not a GPU of this node", uuid))
	}
	holders, err := a.gpuHolders(uuid)
	if err != nil {
		return outcome{}, fail(FailPersist, err)
	}
	if len(holders) > 0 {
		return outcome{}, fail(FailGPUInUse, fmt.Errorf("GPU %s is held by allocation %s: release it before the reset", uuid, strings.Join(holders, ", ")))
	}
	if err := r.ResetGPU(ctx, uuid); err != nil {
		if ctx.Err() != nil {
			return outcome{}, err
		}
		return outcome{}, fail(FailGPUReset, err)
	}
	a.mu.Lock()
	a.events = slices.DeleteFunc(a.events, func(ev *agentv1.HealthEvent) bool { return ev.GetDevice() == uuid })
	a.mu.Unlock()
	if _, err := a.pollFindings(ctx); err != nil {
		a.log.Warn("gpu health not read after the reset", "gpu", uuid, "err", err)
	}
	a.sendStatus()
	a.mu.Lock()
	left := 0
	for _, f := range a.findings.list {
		if f.GetDevice() == uuid {
			left++
		}
	}
	a.mu.Unlock()
	res, _ := structpb.NewStruct(map[string]any{"gpu": uuid, "findings": left})
	return outcome{result: res}, nil
}

// gpuHolders are the allocations whose node binding or kubelet offer holds
// the GPU (or one of its MIG instances).
func (a *Agent) gpuHolders(uuid string) ([]string, error) {
	var holders []string
	dirs, err := filepath.Glob(filepath.Join(string(a.dir), reservationsDir, "*", heldGPUsFile))
	if err != nil {
		return nil, err
	}
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // released meanwhile
			}
			return nil, fmt.Errorf("read the allocation's GPUs: %w", err)
		}
		var gpus []string
		if err := json.Unmarshal(b, &gpus); err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		if slices.Contains(gpus, uuid) {
			holders = append(holders, filepath.Base(filepath.Dir(p)))
		}
	}
	if a.cfg.Kube != nil {
		a.kubeMu.Lock()
		for id, devs := range a.kube.Offered {
			for _, d := range devs {
				if d.UUID == uuid || a.kube.Parents[d.UUID] == uuid {
					holders = append(holders, id)
					break
				}
			}
		}
		for id, w := range a.kube.Withdrawing {
			for _, d := range w.Devices {
				if d.UUID == uuid || a.kube.Parents[d.UUID] == uuid {
					holders = append(holders, id)
					break
				}
			}
		}
		a.kubeMu.Unlock()
	}
	slices.Sort(holders)
	return slices.Compact(holders), nil
}

// holdGPUs records the GPUs an allocation's node binding holds.
func (a *Agent) holdGPUs(allocationID string, gpus []string) error {
	dir := a.allocationDir(allocationID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("allocation directory: %w", err)
	}
	b, err := json.Marshal(gpus)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, heldGPUsFile), b, 0o600); err != nil {
		return fmt.Errorf("record the allocation's GPUs: %w", err)
	}
	return nil
}

// reboot applies node.reboot: it succeeds at once and reboots once its
// final update is reported (or after rebootWait: it is in the command log,
// and the session after the reboot carries it) and the gateway took the
// session's goodbye. A reboot that would fail the command after bcd is
// gone would otherwise read as INTERRUPTED.
func (a *Agent) reboot(c *agentv1.Command) (outcome, error) {
	a.afterReport(c, "reboot", func(ctx context.Context) {
		a.log.Warn("rebooting the node", "command", c.GetId())
		if err := a.cfg.Reboot(ctx); err != nil {
			a.log.Error("reboot failed", "err", err)
		}
	})
	res, _ := structpb.NewStruct(map[string]any{"rebooting": true})
	return outcome{result: res}, nil
}

// afterReport runs then, on a goroutine, once c's final update is reported
// (or after rebootWait: it is in the command log, and the next session
// carries it) and the gateway took the session's goodbye with reason. It
// does not run if Run stops first.
func (a *Agent) afterReport(c *agentv1.Command, reason string, then func(ctx context.Context)) {
	a.mu.Lock()
	ctx := a.runCtx
	a.mu.Unlock()
	if ctx == nil {
		ctx = context.Background()
	}
	go func() {
		deadline := time.Now().Add(rebootWait)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			a.mu.Lock()
			rec := a.cmds.find(c.GetSeq(), c.GetId())
			done := rec != nil && rec.Reported
			a.mu.Unlock()
			if done {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if ctx.Err() != nil {
			return
		}
		// Reported means handed to the stream, not received: a goodbye
		// the gateway answers by closing the session is what says the
		// update before it arrived (as a stopping bcd does).
		if s := a.currentSession(); s != nil && s.goodbye(reason) == nil {
			end := time.Now().Add(a.cfg.GoodbyeTimeout)
			for a.currentSession() == s && time.Now().Before(end) && ctx.Err() == nil {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if ctx.Err() != nil {
			return
		}
		then(ctx)
	}()
}

// systemctlReboot is the default Config.Reboot.
func systemctlReboot(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "systemctl", "reboot").CombinedOutput()
	if err != nil {
		return fmt.Errorf("systemctl reboot: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
