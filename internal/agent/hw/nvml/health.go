//go:build cgo

package nvml

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
	"github.com/better-compute/better-compute/internal/gpuhealth"
)

var (
	_ hw.HealthSource = (*Backend)(nil)
	_ hw.GPUResetter  = (*Backend)(nil)
)

// DefaultRetiredPagesThreshold is how many retired pages (both causes
// together) make a finding: NVIDIA's guidance is to replace a board that
// retires 60 or more.
const DefaultRetiredPagesThreshold = 60

// throttleBits are the clock event reasons that mean the GPU is protecting
// itself (HW thermal, HW power brake, SW thermal slowdown). The others
// (idle, application clocks, SW power cap, sync boost) are normal
// operation and make no finding.
const throttleBits = nvml.ClocksThrottleReasonHwThermalSlowdown | nvml.ClocksThrottleReasonHwPowerBrakeSlowdown |
	nvml.ClocksEventReasonSwThermalSlowdown

// nvlinkErrorCounters are the counters whose rise marks a degraded link.
var nvlinkErrorCounters = []nvml.NvLinkErrorCounter{
	nvml.NVLINK_ERROR_DL_REPLAY, nvml.NVLINK_ERROR_DL_RECOVERY, nvml.NVLINK_ERROR_DL_CRC_FLIT, nvml.NVLINK_ERROR_DL_CRC_DATA,
}

// FindingState is what ReadFindings remembers between polls: each GPU's
// UUID (a lost GPU no longer says it), the NVLinks that were up at its
// first poll (a link that was never up is not "down") and the links' error
// counts. One FindingState belongs to one poller; it is not safe for
// concurrent use.
type FindingState struct {
	// RetiredPagesThreshold is the retired page count that makes a
	// finding (default DefaultRetiredPagesThreshold).
	RetiredPagesThreshold int

	uuids    map[int]string
	linksUp  map[int]map[int]bool
	linkErrs map[int]map[int]uint64
}

func (st *FindingState) init() {
	if st.uuids == nil {
		st.uuids, st.linksUp, st.linkErrs = map[int]string{}, map[int]map[int]bool{}, map[int]map[int]uint64{}
	}
	if st.RetiredPagesThreshold <= 0 {
		st.RetiredPagesThreshold = DefaultRetiredPagesThreshold
	}
}

// Findings reads every GPU's standing health findings.
func (b *Backend) Findings(ctx context.Context) ([]*agentv1.HealthEvent, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lib == nil {
		return nil, errors.New("nvml backend closed")
	}
	return ReadFindings(ctx, b.lib, &b.findings)
}

// WatchXIDs reports the GPUs' XIDs until ctx ends or the backend closes.
func (b *Backend) WatchXIDs(ctx context.Context, report func(*agentv1.HealthEvent)) error {
	b.mu.Lock()
	lib := b.lib
	if lib == nil || b.closed {
		b.mu.Unlock()
		return errors.New("nvml backend closed")
	}
	// Close waits for the watch to end before it shuts NVML down: a Wait
	// on a library that was shut down is undefined.
	b.watchers.Add(1)
	b.mu.Unlock()
	defer b.watchers.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-b.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return WatchXIDs(ctx, lib, report)
}

// ReadFindings reads each GPU's standing health findings through lib,
// which must be initialised, and remembers in st what the next poll
// compares with. A reading the device does not support (NOT_SUPPORTED, or
// a mock without the call) makes no finding; only a GPU that cannot be
// named, other than one that is lost, fails the read.
func ReadFindings(ctx context.Context, lib nvml.Interface, st *FindingState) ([]*agentv1.HealthEvent, error) {
	st.init()
	n, ret := lib.DeviceGetCount()
	if err := check("device count", ret); err != nil {
		return nil, err
	}
	var out []*agentv1.HealthEvent
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret == nvml.ERROR_GPU_IS_LOST {
			out = append(out, hw.Finding(gpuhealth.KindLost, st.uuids[i], i, 0))
			continue
		}
		if err := check(fmt.Sprintf("device %d", i), ret); err != nil {
			return nil, err
		}
		uuid, ret := d.GetUUID()
		if ret == nvml.ERROR_GPU_IS_LOST {
			out = append(out, hw.Finding(gpuhealth.KindLost, st.uuids[i], i, 0))
			continue
		}
		if err := check(fmt.Sprintf("device %d uuid", i), ret); err != nil {
			return nil, err
		}
		st.uuids[i] = uuid
		r := gpuReader{d: d, uuid: uuid, index: i, st: st}
		r.read()
		if r.lost {
			out = append(out, hw.Finding(gpuhealth.KindLost, uuid, i, 0))
			continue
		}
		out = append(out, r.out...)
	}
	// A GPU an earlier poll named that the driver no longer counts has
	// fallen off the bus too.
	for i, uuid := range st.uuids {
		if i >= n {
			out = append(out, hw.Finding(gpuhealth.KindLost, uuid, i, 0))
		}
	}
	hw.SortFindings(out)
	return out, nil
}

// gpuReader reads one GPU's findings; lost is set when any reading says
// the GPU is gone.
type gpuReader struct {
	d     nvml.Device
	uuid  string
	index int
	st    *FindingState
	out   []*agentv1.HealthEvent
	lost  bool
}

func (r *gpuReader) add(kind string, code int64) {
	r.out = append(r.out, hw.Finding(kind, r.uuid, r.index, code))
}

// ok reports whether a reading succeeded, noting a lost GPU.
func (r *gpuReader) ok(ret nvml.Return) bool {
	if ret == nvml.ERROR_GPU_IS_LOST {
		r.lost = true
	}
	return ret == nvml.SUCCESS
}

func (r *gpuReader) read() {
	d := r.d
	try(func() {
		if _, _, pending, failed, ret := d.GetRemappedRows(); r.ok(ret) {
			if pending {
				r.add(gpuhealth.KindRowRemapPending, 0)
			}
			if failed {
				r.add(gpuhealth.KindRowRemapFailed, 0)
			}
		}
	})
	try(func() {
		if n, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); r.ok(ret) && n > 0 {
			r.add(gpuhealth.KindECCUncorrectable, int64(min(n, 1<<62)))
		}
	})
	try(func() {
		total, read := 0, false
		for _, cause := range []nvml.PageRetirementCause{nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR} {
			if pages, ret := d.GetRetiredPages(cause); r.ok(ret) {
				total, read = total+len(pages), true
			}
		}
		if read && total >= r.st.RetiredPagesThreshold {
			r.add(gpuhealth.KindRetiredPages, int64(total))
		}
	})
	try(r.readNVLinks)
	try(func() {
		// Width only: a GPU lowers its link generation at idle to save
		// power, so a generation below the maximum is normal; a width
		// below the maximum is a link that trained badly (a seating or
		// riser fault) and stays that way.
		cur, ret := d.GetCurrPcieLinkWidth()
		if !r.ok(ret) {
			return
		}
		maxW, ret := d.GetMaxPcieLinkWidth()
		if r.ok(ret) && cur > 0 && cur < maxW {
			r.add(gpuhealth.KindPCIeDegraded, int64(cur))
		}
	})
	try(func() {
		if reasons, ret := d.GetCurrentClocksEventReasons(); r.ok(ret) && reasons&throttleBits != 0 {
			r.add(gpuhealth.KindThrottle, int64(reasons&throttleBits))
		}
	})
}

// readNVLinks compares each link with the GPU's first poll: a link up then
// and not now is down; a link whose error counters rose since the last
// poll is degraded.
func (r *gpuReader) readNVLinks() {
	first := r.st.linksUp[r.index] == nil
	if first {
		r.st.linksUp[r.index] = map[int]bool{}
		r.st.linkErrs[r.index] = map[int]uint64{}
	}
	up, errs := r.st.linksUp[r.index], r.st.linkErrs[r.index]
	for l := range nvml.NVLINK_MAX_LINKS {
		state, ret := r.d.GetNvLinkState(l)
		if ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_NOT_SUPPORTED {
			return // past the GPU's last link, or no NVLink at all
		}
		if !r.ok(ret) {
			continue
		}
		active := state == nvml.FEATURE_ENABLED
		if first && active {
			up[l] = true
		}
		if !active {
			if up[l] {
				r.add(gpuhealth.KindNVLinkDown, int64(l))
			}
			continue
		}
		sum, read := r.linkErrors(l)
		if !read {
			continue
		}
		if prev, seen := errs[l]; seen && sum > prev {
			r.add(gpuhealth.KindNVLinkDegraded, int64(l))
		}
		// A reset zeroes the counters: the lower count is the new base.
		errs[l] = sum
	}
}

func (r *gpuReader) linkErrors(l int) (sum uint64, read bool) {
	for _, c := range nvlinkErrorCounters {
		try(func() {
			if n, ret := r.d.GetNvLinkErrorCounter(l, c); r.ok(ret) {
				sum, read = sum+n, true
			}
		})
	}
	return sum, read
}

// xidWait is how long one wait for an event blocks: how late a watch
// notices that its context ended.
const xidWait = 500 * time.Millisecond

// WatchXIDs reports each XID the GPUs raise through lib, which must be
// initialised, until ctx ends: a HealthEvent of kind gpu.xid with the
// GPU's UUID and index, the XID as its code and, when a compute process
// runs on the GPU, that process (the driver does not say which process it
// blamed; the one running is the likely one). A GPU that refuses XID
// events is not watched; it fails only when none can be watched.
func WatchXIDs(ctx context.Context, lib nvml.Interface, report func(*agentv1.HealthEvent)) error {
	set, ret := lib.EventSetCreate()
	if err := check("event set create", ret); err != nil {
		return err
	}
	defer func() { try(func() { _ = set.Free() }) }()
	n, ret := lib.DeviceGetCount()
	if err := check("device count", ret); err != nil {
		return err
	}
	type gpu struct {
		d     nvml.Device
		index int
	}
	byUUID := map[string]gpu{}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		try(func() {
			if d.RegisterEvents(nvml.EventTypeXidCriticalError, set) == nvml.SUCCESS {
				byUUID[uuid] = gpu{d: d, index: i}
			}
		})
	}
	if len(byUUID) == 0 && n > 0 {
		return errors.New("nvml: no GPU accepts XID event registration")
	}
	for ctx.Err() == nil {
		var data nvml.EventData
		ret := nvml.ERROR_NOT_SUPPORTED
		try(func() { data, ret = set.Wait(uint32(xidWait / time.Millisecond)) })
		switch {
		case ret == nvml.ERROR_TIMEOUT:
			continue
		case ret != nvml.SUCCESS:
			// A GPU falling off the bus ends waits with an error; the
			// watch goes on for the others, at a slower pace.
			select {
			case <-ctx.Done():
			case <-time.After(xidWait):
			}
			continue
		case data.EventType&nvml.EventTypeXidCriticalError == 0:
			continue
		}
		ev := &agentv1.HealthEvent{Kind: gpuhealth.KindXID, Code: int64(min(data.EventData, 1<<62)), Time: timestamppb.Now()}
		ev.Message = gpuhealth.Describe(gpuhealth.KindXID, ev.Code)
		if data.Device != nil {
			var uuid string
			try(func() { uuid, _ = data.Device.GetUUID() })
			if g, ok := byUUID[uuid]; ok {
				i := int32(g.index)
				ev.Device, ev.GpuIndex = uuid, &i
				ev.Pid, ev.ProcessName = computeProcess(g.d)
			}
		}
		report(ev)
	}
	return nil
}

// computeProcess is a compute process running on d and its name, 0 and
// "" when none runs or the driver does not say.
func computeProcess(d nvml.Device) (pid int64, name string) {
	try(func() {
		ps, ret := d.GetComputeRunningProcesses()
		if ret == nvml.SUCCESS && len(ps) > 0 {
			pid = int64(ps[0].Pid)
		}
	})
	if pid > 0 {
		name = processName(pid)
	}
	return pid, name
}

// maxProcessName bounds a process name: the kernel's comm is 16 bytes.
const maxProcessName = 64

// processName is /proc/<pid>/comm, best effort, with anything unprintable
// replaced: a tenant names its own processes.
func processName(pid int64) string {
	b, err := os.ReadFile("/proc/" + strconv.FormatInt(pid, 10) + "/comm")
	if err != nil {
		return ""
	}
	name := strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, strings.TrimRight(string(b), "\n"))
	if len(name) > maxProcessName {
		name = name[:maxProcessName]
	}
	return name
}

// gpuUUIDRE is what a GPU UUID looks like; anything else never reaches
// nvidia-smi's command line.
var gpuUUIDRE = regexp.MustCompile(`^GPU-[0-9a-fA-F-]{8,64}$`)

// ResetGPU resets one GPU with nvidia-smi (NVML's own reset needs root and
// the same preconditions; nvidia-smi says why it refused). Nothing may use
// the GPU: the caller checks that no allocation holds it.
func (b *Backend) ResetGPU(ctx context.Context, uuid string) error {
	if !gpuUUIDRE.MatchString(uuid) {
		return fmt.Errorf("reset: %q is not a GPU UUID", uuid)
	}
	smi, err := exec.LookPath("nvidia-smi")
	if err != nil {
		return fmt.Errorf("reset %s: nvidia-smi is not installed or not on PATH (it comes with the NVIDIA driver): %w", uuid, err)
	}
	out, err := exec.CommandContext(ctx, smi, "--gpu-reset", "-i", uuid).CombinedOutput()
	if err != nil {
		return fmt.Errorf("reset %s: nvidia-smi --gpu-reset: %w: %s", uuid, err, strings.TrimSpace(string(out)))
	}
	return nil
}
