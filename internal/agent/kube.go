package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/devfilter"
	"github.com/better-compute/better-compute/internal/gpuhealth"
	"github.com/better-compute/better-compute/internal/kubebind"
)

// BindingKubernetes is DeviceAssignment.binding for GPUs the kubelet
// hands over: bcd offers them to its device plugin and DRA driver
// (Config.Kube) instead of making a cgroup.
const BindingKubernetes = "kubernetes"

// FailNoKubernetes is the failure code of a binding: kubernetes bind on a
// bcd that offers nothing to a kubelet (it runs without --kubernetes).
const FailNoKubernetes = "KUBERNETES_NOT_ENABLED"

// FailKubeOffer is the failure code of a bind whose GPUs the offer
// refused (a GPU another reservation's pods still hold).
const FailKubeOffer = "KUBERNETES_OFFER_FAILED"

// kubeFile keeps what bcd offers its kubelet across restarts.
const kubeFile = "kube.json"

// kubeState is what a restarted bcd offers and withdraws again.
type kubeState struct {
	// Offered are the bound allocations' devices, by allocation.
	Offered map[string][]kubebind.Device `json:"offered,omitempty"`
	// Withdrawing are released allocations whose pods may still hold
	// their devices.
	Withdrawing map[string]*kubeWithdrawal `json:"withdrawing,omitempty"`
	// Unhealthy are the GPUs (and MIG instances) health quarantined.
	Unhealthy []string `json:"unhealthy,omitempty"`
	// Parents maps an offered MIG instance to its GPU: an XID on the GPU
	// quarantines its instances.
	Parents map[string]string `json:"parents,omitempty"`
}

type kubeWithdrawal struct {
	// CommandID is the allocation.release its AllocationReleased answers.
	CommandID string            `json:"command_id"`
	Devices   []kubebind.Device `json:"devices"`
	// Done: no pod holds the devices any more, and no session has
	// carried the AllocationReleased yet.
	Done bool `json:"done,omitempty"`
}

// loadKube reads kube.json and offers again what was offered. A released
// allocation is offered again unhealthy (so the kubelet places nothing new
// on it) until Run withdraws it, once the holders are known.
func (a *Agent) loadKube() error {
	a.kube = kubeState{Offered: map[string][]kubebind.Device{}, Withdrawing: map[string]*kubeWithdrawal{}, Parents: map[string]string{}}
	if _, err := a.dir.readJSON(kubeFile, &a.kube); err != nil {
		return err
	}
	a.kube.Offered = cmpOrMap(a.kube.Offered)
	a.kube.Withdrawing = cmpOrMap(a.kube.Withdrawing)
	a.kube.Parents = cmpOrMap(a.kube.Parents)
	for _, id := range slices.Sorted(maps.Keys(a.kube.Offered)) {
		if err := a.cfg.Kube.Offer(id, a.healthLocked(a.kube.Offered[id])); err != nil {
			a.log.Error("offer again to the kubelet", "allocation", id, "err", err)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(a.kube.Withdrawing)) {
		w := a.kube.Withdrawing[id]
		if w.Done {
			continue
		}
		devs := slices.Clone(w.Devices)
		for i := range devs {
			devs[i].Healthy = false
		}
		if err := a.cfg.Kube.Offer(id, devs); err != nil {
			a.log.Error("offer a released allocation again to wait for its pods", "allocation", id, "err", err)
		}
	}
	return nil
}

func cmpOrMap[K comparable, V any](m map[K]V) map[K]V {
	if m == nil {
		return map[K]V{}
	}
	return m
}

// healthLocked marks the quarantined devices unhealthy.
func (a *Agent) healthLocked(devs []kubebind.Device) []kubebind.Device {
	out := slices.Clone(devs)
	for i := range out {
		out[i].Healthy = !slices.Contains(a.kube.Unhealthy, out[i].UUID)
	}
	return out
}

func (a *Agent) saveKubeLocked() error { return a.dir.writeJSON(kubeFile, &a.kube) }

// kubeLoop withdraws the allocations a previous bcd was withdrawing, once
// the kubelet's holders are known: before that, every device would look
// free.
func (a *Agent) kubeLoop(ctx context.Context) {
	if a.cfg.Kube == nil {
		return
	}
	if h := a.cfg.KubeHolders; h != nil {
		select {
		case <-ctx.Done():
			return
		case <-h:
		}
	}
	a.kubeMu.Lock()
	var ids []string
	for id, w := range a.kube.Withdrawing {
		if !w.Done {
			ids = append(ids, id)
		}
	}
	a.kubeMu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		a.awaitWithdrawal(ctx, id, a.cfg.Kube.Withdraw(id))
	}
}

// awaitWithdrawal reports the allocation released once no pod holds its
// devices.
func (a *Agent) awaitWithdrawal(ctx context.Context, id string, done <-chan struct{}) {
	a.kubeWG.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-done:
		}
		a.kubeMu.Lock()
		w := a.kube.Withdrawing[id]
		if w == nil || w.Done {
			a.kubeMu.Unlock()
			return
		}
		w.Done = true
		if err := a.saveKubeLocked(); err != nil {
			a.log.Error("persist the kubelet's offer", "err", err)
		}
		a.kubeMu.Unlock()
		a.log.Info("no pod holds the released allocation's GPUs any more", "allocation", id)
		if s := a.currentSession(); s != nil {
			if err := a.sendKubeReleased(s, id); err != nil {
				a.log.Warn("send allocation released", "allocation", id, "err", err)
			}
		}
	})
}

// sendKubeReleased sends a completed withdrawal's AllocationReleased
// (signed by the session like every allocation report) and forgets it.
func (a *Agent) sendKubeReleased(s *session, id string) error {
	// One sender at a time: the watcher and a new session's flush must
	// not both send it.
	a.kubeSendMu.Lock()
	defer a.kubeSendMu.Unlock()
	a.kubeMu.Lock()
	w := a.kube.Withdrawing[id]
	a.kubeMu.Unlock()
	if w == nil || !w.Done {
		return nil
	}
	if err := s.send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_AllocationReleased{AllocationReleased: &agentv1.AllocationReleased{
		AllocationId: id, CommandId: w.CommandID,
	}}}); err != nil {
		return fmt.Errorf("send allocation released: %w", err)
	}
	a.kubeMu.Lock()
	defer a.kubeMu.Unlock()
	if a.kube.Withdrawing[id] == w {
		delete(a.kube.Withdrawing, id)
		if err := a.saveKubeLocked(); err != nil {
			a.log.Error("persist the kubelet's offer", "err", err)
		}
	}
	return nil
}

// flushKube sends the releases that completed while no session was up
// (or that none carried before a restart).
func (a *Agent) flushKube(s *session) error {
	if a.cfg.Kube == nil {
		return nil
	}
	a.kubeMu.Lock()
	var ids []string
	for id, w := range a.kube.Withdrawing {
		if w.Done {
			ids = append(ids, id)
		}
	}
	a.kubeMu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		if err := a.sendKubeReleased(s, id); err != nil {
			return err
		}
	}
	return nil
}

// bindKube offers the allocation's GPUs to the kubelet: no cgroup, no
// limits of bcd's; the kubelet gives them to the pods that ask.
func (a *Agent) bindKube(ctx context.Context, da *agentv1.DeviceAssignment) (*structpb.Struct, []*agentv1.Enforcement, error) {
	if a.cfg.Kube == nil {
		return nil, nil, fail(FailNoKubernetes, errors.New("binding kubernetes: this bcd offers no GPUs to a kubelet (it runs without --kubernetes)"))
	}
	if len(da.GetGpuUuids()) == 0 {
		return nil, nil, fail(FailInvalidParams, errors.New("gpu_uuids: binding kubernetes offers GPUs, and names none"))
	}
	devs, parents, err := a.kubeDevices(ctx, da.GetGpuUuids())
	if err != nil {
		return nil, nil, err
	}
	id := da.GetAllocationId()
	a.kubeMu.Lock()
	defer a.kubeMu.Unlock()
	if _, ok := a.kube.Withdrawing[id]; ok {
		return nil, nil, fail(FailInvalidParams, fmt.Errorf("allocation_id: %s was released on this node", id))
	}
	if err := a.cfg.Kube.Offer(id, a.healthLocked(devs)); err != nil {
		return nil, nil, fail(FailKubeOffer, err)
	}
	prev, had := a.kube.Offered[id]
	a.kube.Offered[id] = devs
	maps.Copy(a.kube.Parents, parents)
	if err := a.saveKubeLocked(); err != nil {
		if had {
			_ = a.cfg.Kube.Offer(id, a.healthLocked(prev))
			a.kube.Offered[id] = prev
		} else {
			a.cfg.Kube.Withdraw(id)
			delete(a.kube.Offered, id)
		}
		return nil, nil, fail(FailPersist, err)
	}
	uuids := da.GetGpuUuids()
	res, _ := structpb.NewStruct(map[string]any{"binding": BindingKubernetes, "offered": toAny(uuids)})
	return res, []*agentv1.Enforcement{{
		Resource: "devices", State: agentv1.EnforcementState_ENFORCEMENT_STATE_APPLIED,
		Detail: "the kubelet hands them over: offered to bcd's kubelet plugins, only pods given " + strings.Join(uuids, ", ") + " get their device nodes",
	}}, nil
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// kubeDevices describes the GPUs (or MIG instances) for the kubelet:
// their device nodes (the GPU's /dev/nvidiaN and the control nodes, as
// the device filter allows them) and attributes from the inventory.
func (a *Agent) kubeDevices(ctx context.Context, uuids []string) ([]kubebind.Device, map[string]string, error) {
	inv, err := a.gpus(ctx)
	if err != nil {
		return nil, nil, fail(FailInventory, err)
	}
	ctl, err := devfilter.NvidiaControl(filepath.Join(a.cfg.SysfsRoot, "proc", "devices"))
	if err != nil {
		return nil, nil, fail(FailInventory, err)
	}
	islands := nvlinkIslands(inv)
	parents := map[string]string{}
	var devs []kubebind.Device
	for _, u := range uuids {
		var dev *kubebind.Device
		for _, g := range inv.GetGpus() {
			d := kubebind.Device{UUID: u, Model: g.GetModel(), NVLinkIsland: islands[g.GetUuid()]}
			switch {
			case g.GetUuid() == u:
				d.MemoryMiB = int64(g.GetMemoryMib())
			default:
				i := slices.IndexFunc(g.GetMigInstances(), func(mi *agentv1.MigInstance) bool { return mi.GetUuid() == u })
				if i < 0 {
					continue
				}
				mi := g.GetMigInstances()[i]
				d.MemoryMiB, d.MIGProfile = int64(mi.GetMemoryMib()), mi.GetProfile()
				parents[u] = g.GetUuid()
			}
			if g.MinorNumber == nil {
				return nil, nil, fail(FailInventory, fmt.Errorf("the hardware backend knows no /dev/nvidiaN minor for %s", u))
			}
			d.Paths = []string{devfilter.GPU(g.GetMinorNumber()).Name}
			// Only the control nodes the host has: a container runtime
			// refuses a device whose host path is missing (an H200 host
			// without /dev/nvidia-modeset showed it). A simulated node has
			// no device nodes at all and offers what a real host would.
			onHost := deviceNodeExists(d.Paths[0])
			for _, r := range ctl {
				if !onHost || deviceNodeExists(r.Name) {
					d.Paths = append(d.Paths, r.Name)
				}
			}
			dev = &d
			break
		}
		if dev == nil {
			return nil, nil, fail(FailInvalidParams, fmt.Errorf("gpu_uuids: %s is not a GPU of this node", u))
		}
		devs = append(devs, *dev)
	}
	return devs, parents, nil
}

// deviceNodeExists reports whether path is a character device here.
func deviceNodeExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// nvlinkIslands names each GPU's NVLink island (GPUs joined by NVLink,
// directly or through others) by its lowest GPU index: "nvlink-0". A GPU
// with no NVLink is an island of none ("").
func nvlinkIslands(inv *agentv1.GpuInventory) map[string]string {
	parent := map[string]string{}
	var find func(string) string
	find = func(u string) string {
		if p, ok := parent[u]; ok && p != u {
			parent[u] = find(p)
			return parent[u]
		}
		parent[u] = u
		return u
	}
	linked := map[string]bool{}
	for _, l := range inv.GetNvlinks() {
		if l.GetGpuUuid() == "" || l.GetPeerUuid() == "" {
			continue
		}
		linked[l.GetGpuUuid()], linked[l.GetPeerUuid()] = true, true
		parent[find(l.GetGpuUuid())] = find(l.GetPeerUuid())
	}
	lowest := map[string]int32{}
	for _, g := range inv.GetGpus() {
		if !linked[g.GetUuid()] {
			continue
		}
		r := find(g.GetUuid())
		if cur, ok := lowest[r]; !ok || g.GetIndex() < cur {
			lowest[r] = g.GetIndex()
		}
	}
	out := map[string]string{}
	for _, g := range inv.GetGpus() {
		if linked[g.GetUuid()] {
			out[g.GetUuid()] = fmt.Sprintf("nvlink-%d", lowest[find(g.GetUuid())])
		}
	}
	return out
}

// releaseKube withdraws an allocation offered to the kubelet. ok is false
// for one that is not (bcd's own cgroup release applies). The release
// completes at once when no pod holds its devices; otherwise the command
// succeeds saying held_by_pods, and AllocationReleased follows when the
// last pod lets go.
func (a *Agent) releaseKube(c *agentv1.Command, id string) (outcome, bool, error) {
	if a.cfg.Kube == nil {
		return outcome{}, false, nil
	}
	a.kubeMu.Lock()
	if w, ok := a.kube.Withdrawing[id]; ok {
		// Released before (another command): its AllocationReleased
		// answers that one.
		a.kubeMu.Unlock()
		res, _ := structpb.NewStruct(map[string]any{"binding": BindingKubernetes, "held_by_pods": !w.Done})
		return outcome{result: res}, true, nil
	}
	devs, ok := a.kube.Offered[id]
	if !ok {
		a.kubeMu.Unlock()
		return outcome{}, false, nil
	}
	w := &kubeWithdrawal{CommandID: c.GetId(), Devices: devs}
	a.kube.Withdrawing[id] = w
	delete(a.kube.Offered, id)
	// Written before the offer changes: a bcd that dies now withdraws it
	// again when it starts.
	if err := a.saveKubeLocked(); err != nil {
		delete(a.kube.Withdrawing, id)
		a.kube.Offered[id] = devs
		a.kubeMu.Unlock()
		return outcome{}, true, fail(FailPersist, err)
	}
	done := a.cfg.Kube.Withdraw(id)
	select {
	case <-done:
		delete(a.kube.Withdrawing, id)
		err := a.saveKubeLocked()
		a.kubeMu.Unlock()
		if err != nil {
			a.log.Error("persist the kubelet's offer", "err", err)
		}
		res, _ := structpb.NewStruct(map[string]any{"binding": BindingKubernetes, "held_by_pods": false})
		return outcome{result: res, extra: []*agentv1.AgentMessage{{Msg: &agentv1.AgentMessage_AllocationReleased{AllocationReleased: &agentv1.AllocationReleased{
			AllocationId: id, CommandId: c.GetId(),
		}}}}}, true, nil
	default:
	}
	a.kubeMu.Unlock()
	a.mu.Lock()
	ctx := a.runCtx
	a.mu.Unlock()
	a.awaitWithdrawal(ctx, id, done)
	res, _ := structpb.NewStruct(map[string]any{"binding": BindingKubernetes, "held_by_pods": true})
	return outcome{result: res}, true, nil
}

// quarantineKube marks the GPU an event takes out of service (and its MIG
// instances) unhealthy in the kubelet's offer, at once: the control plane
// quarantines it for placement from the same event.
func (a *Agent) quarantineKube(ev *agentv1.HealthEvent) {
	if a.cfg.Kube == nil || !gpuhealth.Quarantines(ev.GetKind(), ev.GetDevice(), ev.GetCode()) {
		return
	}
	gpu := ev.GetDevice()
	a.kubeMu.Lock()
	defer a.kubeMu.Unlock()
	uuids := []string{gpu}
	for mig, parent := range a.kube.Parents {
		if parent == gpu {
			uuids = append(uuids, mig)
		}
	}
	for _, u := range uuids {
		a.cfg.Kube.SetHealth(u, false)
		if !slices.Contains(a.kube.Unhealthy, u) {
			a.kube.Unhealthy = append(a.kube.Unhealthy, u)
		}
	}
	if err := a.saveKubeLocked(); err != nil {
		a.log.Error("persist the kubelet's offer", "err", err)
	}
}

// clearKubeHealth offers every quarantined GPU healthy again.
func (a *Agent) clearKubeHealth() {
	if a.cfg.Kube == nil {
		return
	}
	a.kubeMu.Lock()
	defer a.kubeMu.Unlock()
	for _, u := range a.kube.Unhealthy {
		// A released allocation's devices stay out of the kubelet's
		// reach until it is withdrawn.
		if !slices.ContainsFunc(slices.Collect(maps.Values(a.kube.Withdrawing)), func(w *kubeWithdrawal) bool {
			return slices.ContainsFunc(w.Devices, func(d kubebind.Device) bool { return d.UUID == u })
		}) {
			a.cfg.Kube.SetHealth(u, true)
		}
	}
	a.kube.Unhealthy = nil
	if err := a.saveKubeLocked(); err != nil {
		a.log.Error("persist the kubelet's offer", "err", err)
	}
}
