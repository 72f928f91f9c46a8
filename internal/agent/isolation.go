package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/cgroups"
	"github.com/better-compute/better-compute/internal/agent/confine"
	"github.com/better-compute/better-compute/internal/agent/devfilter"
)

// Capabilities bcd advertises only where it enforces them.
const (
	CapCgroups   = "cgroups.v2"     // it creates allocation cgroups under its root
	CapDevices   = "devices.limits" // a device program confines an allocation to its GPUs
	CapCPU       = "cpu.limits"     // cpu.max is enforced
	CapMemory    = "memory.limits"  // memory.max is enforced
	CapCPUSet    = "cpuset.limits"  // cpuset.cpus/mems are enforced
	CapSimulated = "simulated"      // a simulated node: its limits are written, not enforced
	// CapExecIsolated: an allocation's processes run confined (their own
	// uid/gid, new user, mount, PID, IPC and cgroup namespaces,
	// no_new_privs, private /tmp, bcd's state hidden) in the allocation's
	// cgroup v2 with its device filter.
	CapExecIsolated = "exec.isolated"
)

// FailDeviceFilter is the failure code of a bind whose device program did
// not attach on a node that advertises devices.limits.
const FailDeviceFilter = "DEVICE_FILTER_FAILED"

// isolation is what the start-up probe found bcd can enforce.
type isolation struct {
	// cgroupErr says why no allocation cgroup can be made under the root.
	cgroupErr error
	// devicesErr says why no device program can be attached.
	devicesErr error
	// controllers gives, per cgroups.Controllers entry, why its limits
	// are not enforced ("" when they are).
	controllers map[string]string
	simulated   bool
	// execErr says why processes cannot be confined (package confine).
	execErr error
}

// probeExec starts one confined process: only where that works are
// allocations' processes confined.
func probeExec(m cgroups.Manager, uid uint32) error {
	cg2 := ""
	if m.Real() {
		cg2 = cgroups.Cgroup2Mount()
	}
	return confine.Probe(uid, uid, cg2)
}

// execIsolated says why exec.isolated is not advertised ("" when it is).
func (iso isolation) execIsolated() string {
	switch {
	case iso.execErr != nil:
		return "processes are not confined: " + iso.execErr.Error()
	case iso.simulated:
		return "a simulated node enforces no cgroup or device limits"
	case iso.cgroupErr != nil:
		return "no allocation cgroups: " + iso.cgroupErr.Error()
	case iso.devicesErr != nil:
		return "no device filter: " + iso.devicesErr.Error()
	}
	return ""
}

// probeIsolation makes a throw-away cgroup under the root, attaches the
// device filter to it and looks at which controllers it has: what works
// here is what bcd advertises.
func probeIsolation(m cgroups.Manager, filter devfilter.Attacher, simulated bool) isolation {
	iso := isolation{simulated: simulated, controllers: map[string]string{}}
	why, err := m.Delegate()
	if err != nil {
		iso.cgroupErr = err
		iso.devicesErr = err
		for _, c := range cgroups.Controllers {
			iso.controllers[c] = err.Error()
		}
		return iso
	}
	iso.controllers = why
	dir, err := os.MkdirTemp(m.Root, "probe-")
	if err != nil {
		iso.cgroupErr = fmt.Errorf("create a cgroup under %s: %w", m.Root, err)
		iso.devicesErr = iso.cgroupErr
		return iso
	}
	defer func() {
		if err := m.Remove(filepath.Base(dir)); err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := filter.Attach(dir, devfilter.Pseudo()); err != nil {
		iso.devicesErr = err
	}
	return iso
}

func (iso isolation) capabilities() []string {
	var caps []string
	if iso.cgroupErr != nil {
		return nil
	}
	caps = append(caps, CapCgroups)
	if iso.devicesErr == nil {
		caps = append(caps, CapDevices)
	}
	for _, c := range []struct{ controller, cap string }{{"cpu", CapCPU}, {"memory", CapMemory}, {"cpuset", CapCPUSet}} {
		if iso.controllers[c.controller] == "" {
			caps = append(caps, c.cap)
		}
	}
	if iso.simulated {
		caps = append(caps, CapSimulated)
	}
	if iso.execIsolated() == "" {
		caps = append(caps, CapExecIsolated)
	}
	return caps
}

// deviceRules are the devices an allocation of gpuUUIDs may open: each
// GPU's /dev/nvidiaN (minor from the hardware backend's inventory), the
// NVIDIA control nodes and the pseudo-devices. A UUID that is not a GPU of
// this node is an error of the command; a GPU whose minor the backend does
// not know cannot be confined (missing says which).
func (a *Agent) deviceRules(ctx context.Context, gpuUUIDs []string) (deviceSet, error) {
	var ds deviceSet
	inv, err := a.gpus(ctx)
	if err != nil {
		return ds, fail(FailInventory, err)
	}
	byUUID := map[string]*agentv1.Gpu{}
	for _, g := range inv.GetGpus() {
		byUUID[g.GetUuid()] = g
		// A MIG instance lives on its parent's /dev/nvidiaN.
		for _, mi := range g.GetMigInstances() {
			byUUID[mi.GetUuid()] = g
		}
	}
	seen := map[int32]bool{}
	for _, u := range gpuUUIDs {
		g, ok := byUUID[u]
		if !ok {
			return ds, fail(FailInvalidParams, fmt.Errorf("gpu_uuids: %s is not a GPU of this node", u))
		}
		if g.MinorNumber == nil {
			ds.missing = append(ds.missing, u)
			ds.gpus = append(ds.gpus, g.GetUuid())
			continue
		}
		ds.gpus = append(ds.gpus, g.GetUuid())
		if !seen[g.GetMinorNumber()] {
			seen[g.GetMinorNumber()] = true
			r := devfilter.GPU(g.GetMinorNumber())
			ds.rules = append(ds.rules, r)
			ds.names = append(ds.names, r.Name)
		}
	}
	ctl, err := devfilter.NvidiaControl(filepath.Join(a.cfg.SysfsRoot, "proc", "devices"))
	if err != nil {
		return ds, fail(FailInventory, err)
	}
	for _, r := range ctl {
		ds.names = append(ds.names, r.Name)
	}
	pseudo := devfilter.Pseudo()
	ds.names = append(ds.names, fmt.Sprintf("%d pseudo-devices", len(pseudo)))
	ds.rules = append(append(ds.rules, ctl...), pseudo...)
	return ds, nil
}

// deviceSet is what deviceRules made of an allocation's GPUs.
type deviceSet struct {
	rules   []devfilter.Rule
	names   []string
	missing []string
	// gpus are the GPUs the allocation holds (a MIG instance's parent).
	gpus []string
}

// enforceDevices confines the allocation's cgroup to its devices and says
// what it did.
func (a *Agent) enforceDevices(dir string, ds deviceSet) (*agentv1.Enforcement, error) {
	e := &agentv1.Enforcement{Resource: "devices"}
	switch {
	case a.iso.devicesErr != nil:
		e.State, e.Detail = agentv1.EnforcementState_ENFORCEMENT_STATE_NOT_APPLIED, "no device filter on this node: "+a.iso.devicesErr.Error()
		return e, nil //nolint:nilerr // the probe's failure is reported as not applied; the bind goes on
	case len(ds.missing) > 0:
		e.State, e.Detail = agentv1.EnforcementState_ENFORCEMENT_STATE_NOT_APPLIED,
			"the hardware backend knows no /dev/nvidiaN minor for "+strings.Join(ds.missing, ", ")
		return e, nil
	}
	if err := a.filter.Attach(dir, ds.rules); err != nil {
		// The node advertised devices.limits, so the control plane placed
		// work here that needs it: a bind without it must fail.
		return nil, fail(FailDeviceFilter, err)
	}
	e.State, e.Detail = agentv1.EnforcementState_ENFORCEMENT_STATE_APPLIED, "only "+strings.Join(ds.names, ", ")
	if a.iso.simulated {
		e.State = agentv1.EnforcementState_ENFORCEMENT_STATE_SIMULATED
		e.Detail = "simulated node: allow list written to " + devfilter.SimulatedFile + ", nothing enforces it: " + strings.Join(ds.names, ", ")
	}
	return e, nil
}

var enforcementStates = map[cgroups.State]agentv1.EnforcementState{
	cgroups.Applied:      agentv1.EnforcementState_ENFORCEMENT_STATE_APPLIED,
	cgroups.NotApplied:   agentv1.EnforcementState_ENFORCEMENT_STATE_NOT_APPLIED,
	cgroups.Simulated:    agentv1.EnforcementState_ENFORCEMENT_STATE_SIMULATED,
	cgroups.NotRequested: agentv1.EnforcementState_ENFORCEMENT_STATE_NOT_REQUESTED,
}

// bind creates the allocation's cgroup, applies its limits and device
// filter, and returns the cgroup and what is enforced.
func (a *Agent) bind(ctx context.Context, da *agentv1.DeviceAssignment) (string, []*agentv1.Enforcement, error) {
	if a.iso.cgroupErr != nil {
		return "", nil, fail(FailCgroupWrite, fmt.Errorf("no allocation cgroups on this node: %w", a.iso.cgroupErr))
	}
	// Checked before anything is written: a GPU that is not this node's
	// leaves no cgroup behind.
	ds, err := a.deviceRules(ctx, da.GetGpuUuids())
	if err != nil {
		return "", nil, err
	}
	dir, results, err := a.cg.Apply(da.GetAllocationId(), cgroups.Limits{
		CPUQuotaUS: da.GetCpuQuotaUs(), CPUPeriodUS: da.GetCpuPeriodUs(), MemoryMaxBytes: da.GetMemoryMaxBytes(),
		CPUs: da.GetCpusetCpus(), Mems: da.GetCpusetMems(),
	})
	if errors.Is(err, cgroups.ErrInvalidID) {
		return "", nil, fail(FailInvalidParams, err)
	}
	if err != nil {
		return "", nil, fail(FailCgroupWrite, err)
	}
	dev, err := a.enforceDevices(dir, ds)
	if err != nil {
		return "", nil, err
	}
	// gpu.reset refuses a GPU an allocation holds.
	if err := a.holdGPUs(da.GetAllocationId(), slices.Compact(slices.Sorted(slices.Values(ds.gpus)))); err != nil {
		return "", nil, fail(FailPersist, err)
	}
	enforced := []*agentv1.Enforcement{dev}
	for _, r := range results {
		enforced = append(enforced, &agentv1.Enforcement{Resource: r.Resource, State: enforcementStates[r.State], Detail: r.Detail})
	}
	return dir, enforced, nil
}
