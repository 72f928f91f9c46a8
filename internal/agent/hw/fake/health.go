package fake

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
	"github.com/better-compute/better-compute/internal/gpuhealth"
)

var (
	_ hw.HealthSource = (*Backend)(nil)
	_ hw.GPUResetter  = (*Backend)(nil)
)

// Codes the fake uses for an injected finding given code 0, and the
// bounds the reader applies (see hw/nvml's health.go).
const (
	retiredPagesThreshold = 60   // nvml.DefaultRetiredPagesThreshold
	maxPCIeWidth          = 16   // every fake GPU's link is x16
	throttleBits          = 0xe0 // HW thermal | HW power brake | SW thermal slowdown
)

// faults is the bad state injected into a fake machine: each finding kind
// on each GPU with its code, the NVLink error counts that grow while a
// link is degraded, the compute process running on each GPU, and XIDs
// raised while nothing watched.
type faults struct {
	mu       sync.Mutex
	gpus     int
	on       map[faultKey]int64
	linkErrs map[[2]int]uint64
	procs    map[int]int64
	// pendingXIDs were raised before any watch registered: delivered to
	// the first one, so that a test need not race the agent's start.
	pendingXIDs []xid
}

type faultKey struct {
	kind string
	gpu  int
}

type xid struct {
	gpu  int
	code int64
}

func newFaults(gpus int) *faults {
	return &faults{gpus: gpus, on: map[faultKey]int64{}, linkErrs: map[[2]int]uint64{}, procs: map[int]int64{}}
}

func (f *faults) get(kind string, gpu int) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.on[faultKey{kind, gpu}]
	return c, ok
}

func (f *faults) proc(gpu int) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.procs[gpu]
}

// normCode is the code a finding of kind injected with code comes back
// with: a code of 0 takes a typical value where 0 would make no finding.
func normCode(kind string, code int64) int64 {
	switch kind {
	case gpuhealth.KindECCUncorrectable:
		return max(code, 1)
	case gpuhealth.KindRetiredPages:
		if code <= 0 {
			return retiredPagesThreshold
		}
	case gpuhealth.KindPCIeDegraded:
		if code <= 0 || code >= maxPCIeWidth {
			return maxPCIeWidth / 2
		}
	case gpuhealth.KindThrottle:
		if code&throttleBits == 0 {
			return 0x40 // HW thermal slowdown
		}
		return code & throttleBits
	case gpuhealth.KindRowRemapPending, gpuhealth.KindRowRemapFailed, gpuhealth.KindLost:
		return 0
	}
	return code
}

// InjectFinding makes GPU gpuIndex show a standing finding of kind (any
// of gpuhealth.Kinds but gpu.xid) on its next reads: the mock's answers
// change, and the reader finds it. code is what the finding carries (the
// link for the NVLink kinds, the count for ECC and retired pages, the
// current width for PCIe, the reason bits for throttle); 0 takes a typical
// value. A kind the fake does not know, or a GPU it does not have, is a
// bug in the test and panics.
func (b *Backend) InjectFinding(kind string, gpuIndex int, code int64) {
	f := b.faults
	if kind == gpuhealth.KindXID || !slices.Contains(gpuhealth.Kinds, kind) {
		panic(fmt.Sprintf("fake: cannot inject finding kind %q (XIDs go through InjectXID)", kind))
	}
	if gpuIndex < 0 || gpuIndex >= f.gpus {
		panic(fmt.Sprintf("fake: no GPU %d (the machine has %d)", gpuIndex, f.gpus))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.on[faultKey{kind, gpuIndex}] = normCode(kind, code)
}

// ClearFinding takes the finding of kind off GPU gpuIndex.
func (b *Backend) ClearFinding(kind string, gpuIndex int) {
	b.faults.mu.Lock()
	defer b.faults.mu.Unlock()
	delete(b.faults.on, faultKey{kind, gpuIndex})
}

// InjectXID raises XID code on GPU gpuIndex, with process pid running on
// it (0: none), for every WatchXIDs on the machine. Raised while nothing
// watches, it waits for the first watch.
func (b *Backend) InjectXID(gpuIndex int, code int64, pid int64) {
	f := b.faults
	if gpuIndex < 0 || gpuIndex >= f.gpus {
		panic(fmt.Sprintf("fake: no GPU %d (the machine has %d)", gpuIndex, f.gpus))
	}
	f.mu.Lock()
	f.procs[gpuIndex] = pid
	f.mu.Unlock()
	b.health.deliverXID(xid{gpu: gpuIndex, code: code})
}

// ResetGPU resets the fake GPU: what a reset clears (pending row remaps,
// volatile ECC counts) goes; a failed remap or a lost GPU stays.
func (b *Backend) ResetGPU(ctx context.Context, uuid string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	i := slices.Index(b.identity.GetGpuUuids(), uuid)
	if i < 0 {
		return fmt.Errorf("reset: no GPU %s on this machine", uuid)
	}
	f := b.faults
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, lost := f.on[faultKey{gpuhealth.KindLost, i}]; lost {
		return fmt.Errorf("reset %s: the GPU is lost", uuid)
	}
	delete(f.on, faultKey{gpuhealth.KindRowRemapPending, i})
	delete(f.on, faultKey{gpuhealth.KindECCUncorrectable, i})
	return nil
}

// Reboot is the machine power-cycling: every injected finding but a failed
// row remap (that is the hardware) clears, and no process runs.
func (b *Backend) Reboot() {
	f := b.faults
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range f.on {
		if k.kind != gpuhealth.KindRowRemapFailed {
			delete(f.on, k)
		}
	}
	clear(f.procs)
}

// Findings reads the GPUs' standing findings: with cgo through the NVML
// reader over the mock, without from the injected state directly.
func (b *Backend) Findings(ctx context.Context) ([]*agentv1.HealthEvent, error) {
	return b.health.Findings(ctx)
}

// WatchXIDs reports the XIDs InjectXID raises until ctx ends.
func (b *Backend) WatchXIDs(ctx context.Context, report func(*agentv1.HealthEvent)) error {
	return b.health.WatchXIDs(ctx, report)
}

// healthPath is how a fake machine's health is read: the NVML reader over
// the mock (cgo) or the snapshot's stand-in.
type healthPath interface {
	hw.HealthSource
	deliverXID(x xid)
}

// snapshotHealth makes of the injected state what the NVML reader makes of
// the mock that state sets up (a cgo test keeps the two equal).
type snapshotHealth struct {
	faults *faults
	uuids  []string
	// links is each GPU's count of NVLinks (up at its first poll).
	links []int

	mu   sync.Mutex
	subs map[chan xid]struct{}
}

func (s *snapshotHealth) Findings(ctx context.Context) ([]*agentv1.HealthEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f := s.faults
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*agentv1.HealthEvent
	for i, uuid := range s.uuids {
		if _, lost := f.on[faultKey{gpuhealth.KindLost, i}]; lost {
			out = append(out, hw.Finding(gpuhealth.KindLost, uuid, i, 0))
			continue
		}
		for _, kind := range gpuhealth.Kinds {
			code, ok := f.on[faultKey{kind, i}]
			if !ok {
				continue
			}
			switch kind {
			case gpuhealth.KindRetiredPages:
				ok = code >= retiredPagesThreshold
			case gpuhealth.KindNVLinkDown:
				ok = code >= 0 && code < int64(s.links[i])
			case gpuhealth.KindNVLinkDegraded:
				down, isDown := f.on[faultKey{gpuhealth.KindNVLinkDown, i}]
				ok = code >= 0 && code < int64(s.links[i]) && (!isDown || down != code)
			}
			if ok {
				out = append(out, hw.Finding(kind, uuid, i, code))
			}
		}
	}
	hw.SortFindings(out)
	return out, nil
}

func (s *snapshotHealth) WatchXIDs(ctx context.Context, report func(*agentv1.HealthEvent)) error {
	ch := make(chan xid, 64)
	s.mu.Lock()
	if s.subs == nil {
		s.subs = map[chan xid]struct{}{}
	}
	s.subs[ch] = struct{}{}
	s.faults.mu.Lock()
	pending := s.faults.pendingXIDs
	s.faults.pendingXIDs = nil
	s.faults.mu.Unlock()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, ch)
		s.mu.Unlock()
	}()
	for _, x := range pending {
		ch <- x
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case x := <-ch:
			report(xidEvent(x, s.uuids[x.gpu], s.faults.proc(x.gpu)))
		}
	}
}

func (s *snapshotHealth) deliverXID(x xid) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.subs) == 0 {
		s.faults.mu.Lock()
		s.faults.pendingXIDs = append(s.faults.pendingXIDs, x)
		s.faults.mu.Unlock()
		return
	}
	for ch := range s.subs {
		select {
		case ch <- x:
		default: // a watcher that does not keep up loses events, as NVML's
		}
	}
}

// xidEvent is what hw/nvml.WatchXIDs reports for x.
func xidEvent(x xid, uuid string, pid int64) *agentv1.HealthEvent {
	i := int32(x.gpu)
	ev := &agentv1.HealthEvent{
		Kind: gpuhealth.KindXID, Device: uuid, Code: x.code, GpuIndex: &i, Time: timestamppb.New(time.Now()),
		Message: gpuhealth.Describe(gpuhealth.KindXID, x.code), Pid: pid,
	}
	if pid > 0 {
		ev.ProcessName = processName(pid)
	}
	return ev
}

// processName is /proc/<pid>/comm, as hw/nvml reads it.
func processName(pid int64) string {
	b, err := os.ReadFile("/proc/" + strconv.FormatInt(pid, 10) + "/comm")
	if err != nil {
		return ""
	}
	return strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, strings.TrimRight(string(b), "\n"))
}
