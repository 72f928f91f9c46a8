//go:build cgo

package fake

import (
	"context"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	nvmlbackend "github.com/better-compute/better-compute/internal/agent/hw/nvml"
	"github.com/better-compute/better-compute/internal/gpuhealth"
)

// mockHealth reads the fake machine's health through the NVML reader over
// the mock, whose answers follow the injected faults (wireHealth).
type mockHealth struct {
	*nvmlbackend.Backend
	events *mockEvents
}

func (m mockHealth) deliverXID(x xid) { m.events.deliver(x) }

// wireHealth makes each mock device answer the health readings from f:
// row remaps, ECC, retired pages, PCIe width, clock event reasons, NVLink
// state and error counters, a lost GPU's UUID, its running processes, and
// XID events through the event sets of events.
func wireHealth(srv *server.Server, devs []*server.Device, links [][]int, f *faults, events *mockEvents) {
	srv.EventSetCreateFunc = events.create
	for i, d := range devs {
		d.GetUUIDFunc = func() (string, nvml.Return) {
			if _, lost := f.get(gpuhealth.KindLost, i); lost {
				return "", nvml.ERROR_GPU_IS_LOST
			}
			return d.UUID, nvml.SUCCESS
		}
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
			_, pending := f.get(gpuhealth.KindRowRemapPending, i)
			_, failed := f.get(gpuhealth.KindRowRemapFailed, i)
			return 0, 0, pending, failed, nvml.SUCCESS
		}
		d.GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, counter nvml.EccCounterType) (uint64, nvml.Return) {
			if n, ok := f.get(gpuhealth.KindECCUncorrectable, i); ok && typ == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
				return uint64(n), nvml.SUCCESS
			}
			return 0, nvml.SUCCESS
		}
		d.GetRetiredPagesFunc = func(cause nvml.PageRetirementCause) ([]uint64, nvml.Return) {
			if n, ok := f.get(gpuhealth.KindRetiredPages, i); ok && cause == nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS {
				pages := make([]uint64, n)
				for p := range pages {
					pages[p] = uint64(p) << 12
				}
				return pages, nvml.SUCCESS
			}
			return nil, nvml.SUCCESS
		}
		d.GetMaxPcieLinkWidthFunc = func() (int, nvml.Return) { return maxPCIeWidth, nvml.SUCCESS }
		d.GetCurrPcieLinkWidthFunc = func() (int, nvml.Return) {
			if w, ok := f.get(gpuhealth.KindPCIeDegraded, i); ok {
				return int(w), nvml.SUCCESS
			}
			return maxPCIeWidth, nvml.SUCCESS
		}
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
			if bits, ok := f.get(gpuhealth.KindThrottle, i); ok {
				return uint64(bits), nvml.SUCCESS
			}
			// An idle GPU: a reason that is no finding.
			return nvml.ClocksEventReasonGpuIdle, nvml.SUCCESS
		}
		n := len(links[i])
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= nvml.NVLINK_MAX_LINKS {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if down, ok := f.get(gpuhealth.KindNVLinkDown, i); ok && int(down) == link {
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			if link < n {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		d.GetNvLinkErrorCounterFunc = func(link int, counter nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
			if counter != nvml.NVLINK_ERROR_DL_REPLAY {
				return 0, nvml.SUCCESS
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			key := [2]int{i, link}
			// A degraded link replays between any two reads.
			if l, ok := f.on[faultKey{gpuhealth.KindNVLinkDegraded, i}]; ok && int(l) == link {
				f.linkErrs[key]++
			}
			return f.linkErrs[key], nvml.SUCCESS
		}
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			if pid := f.proc(i); pid > 0 {
				return []nvml.ProcessInfo{{Pid: uint32(pid)}}, nvml.SUCCESS
			}
			return nil, nvml.SUCCESS
		}
		d.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
			return events.register(set, i)
		}
	}
}

// mockEvents are the mock's event sets: InjectXID raises an XID on each
// set its GPU is registered with.
type mockEvents struct {
	mu     sync.Mutex
	devs   []*server.Device
	faults *faults
	sets   map[*eventSet]struct{}
}

type eventSet struct {
	mock.EventSet
	ch   chan nvml.EventData
	gpus map[int]bool // guarded by mockEvents.mu
}

func (e *mockEvents) create() (nvml.EventSet, nvml.Return) {
	es := &eventSet{ch: make(chan nvml.EventData, 64), gpus: map[int]bool{}}
	es.WaitFunc = func(ms uint32) (nvml.EventData, nvml.Return) {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		select {
		case d := <-es.ch:
			return d, nvml.SUCCESS
		case <-t.C:
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
	}
	es.FreeFunc = func() nvml.Return {
		e.mu.Lock()
		defer e.mu.Unlock()
		delete(e.sets, es)
		return nvml.SUCCESS
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sets == nil {
		e.sets = map[*eventSet]struct{}{}
	}
	e.sets[es] = struct{}{}
	return es, nvml.SUCCESS
}

func (e *mockEvents) register(set nvml.EventSet, gpu int) nvml.Return {
	es, ok := set.(*eventSet)
	if !ok {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	es.gpus[gpu] = true
	// XIDs raised while nothing watched this GPU go to its first watch.
	e.faults.mu.Lock()
	var keep []xid
	for _, x := range e.faults.pendingXIDs {
		if x.gpu == gpu {
			e.sendLocked(es, x)
		} else {
			keep = append(keep, x)
		}
	}
	e.faults.pendingXIDs = keep
	e.faults.mu.Unlock()
	return nvml.SUCCESS
}

func (e *mockEvents) deliver(x xid) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sent := false
	for es := range e.sets {
		if es.gpus[x.gpu] {
			e.sendLocked(es, x)
			sent = true
		}
	}
	if !sent {
		e.faults.mu.Lock()
		e.faults.pendingXIDs = append(e.faults.pendingXIDs, x)
		e.faults.mu.Unlock()
	}
}

func (e *mockEvents) sendLocked(es *eventSet, x xid) {
	select {
	case es.ch <- nvml.EventData{Device: e.devs[x.gpu], EventType: nvml.EventTypeXidCriticalError, EventData: uint64(x.code)}:
	default: // a watch that does not keep up loses events, as NVML's does
	}
}

// baseline is the reader's first poll: the NVLinks up now are the ones
// whose going down is a finding.
func baseline(b *nvmlbackend.Backend) {
	_, _ = b.Findings(context.Background())
}
