package fake

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
)

// migOverlay is what ConfigureMIG changed: the mocks' MIG state is fixed,
// so the fake keeps each repartitioned GPU's layout and reports it in
// place of the mock's.
type migOverlay struct {
	mu      sync.Mutex
	layouts map[string][]string // by GPU UUID
	busy    map[string]bool
}

// Inventory is the machine's inventory with the MIG layouts ConfigureMIG
// set.
func (b *Backend) Inventory(ctx context.Context) (*agentv1.GpuInventory, error) {
	inv, err := b.Backend.Inventory(ctx)
	if err != nil {
		return nil, err
	}
	b.mig.mu.Lock()
	defer b.mig.mu.Unlock()
	if len(b.mig.layouts) == 0 {
		return inv, nil
	}
	inv = proto.Clone(inv).(*agentv1.GpuInventory)
	for _, g := range inv.GetGpus() {
		layout, ok := b.mig.layouts[g.GetUuid()]
		if !ok {
			continue
		}
		g.MigMode, g.MigInstances = "enabled", nil
		for i, p := range layout {
			gb, _ := profileSize(p)
			g.MigInstances = append(g.MigInstances, &agentv1.MigInstance{
				Uuid: "MIG-" + uuidFrom(g.GetUuid(), strconv.Itoa(i), p), Profile: p,
				GpuInstanceId: uint32(i + 1), MemoryMib: uint64(gb) * 1024,
			})
		}
	}
	return inv, nil
}

// ConfigureMIG gives the GPU the layout profiles. Like the hardware it
// refuses a layout that does not fit the GPU (more than 7 compute slices,
// or more memory than the GPU has) and a GPU in use (SetBusy).
func (b *Backend) ConfigureMIG(ctx context.Context, uuid string, profiles []string) error {
	inv, err := b.Backend.Inventory(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(inv.GetGpus(), func(g *agentv1.Gpu) bool { return g.GetUuid() == uuid })
	if i < 0 {
		return fmt.Errorf("fake: GPU %s: %w", uuid, hw.ErrNoGPU)
	}
	memGB := int((inv.GetGpus()[i].GetMemoryMib() + 1023) / 1024)
	slicesUsed, gbUsed := 0, 0
	for _, p := range profiles {
		g, gb := profileSlices(p)
		if g <= 0 {
			return fmt.Errorf("fake: GPU %s: profile %q: %w", uuid, p, hw.ErrMIGLayout)
		}
		slicesUsed, gbUsed = slicesUsed+g, gbUsed+gb
	}
	if slicesUsed > 7 || gbUsed > memGB {
		return fmt.Errorf("fake: GPU %s: %s takes %d compute slices and %d GB: %w", uuid, strings.Join(profiles, "+"), slicesUsed, gbUsed, hw.ErrMIGLayout)
	}
	b.mig.mu.Lock()
	defer b.mig.mu.Unlock()
	if b.mig.busy[uuid] {
		return fmt.Errorf("fake: GPU %s: %w", uuid, hw.ErrGPUBusy)
	}
	if b.mig.layouts == nil {
		b.mig.layouts = map[string][]string{}
	}
	b.mig.layouts[uuid] = slices.Clone(profiles)
	return nil
}

// SetBusy makes ConfigureMIG refuse the GPU as if a process ran on it.
func (b *Backend) SetBusy(uuid string, busy bool) {
	b.mig.mu.Lock()
	defer b.mig.mu.Unlock()
	if b.mig.busy == nil {
		b.mig.busy = map[string]bool{}
	}
	b.mig.busy[uuid] = busy
}

// profileSlices reads "3g.40gb" as 3 compute slices and 40 GB; zeros when
// it is not a profile name.
func profileSlices(p string) (int, int) {
	g, rest, ok := strings.Cut(p, "g.")
	if !ok {
		return 0, 0
	}
	n, err := strconv.Atoi(g)
	gb, ok2 := profileSize(rest)
	if err != nil || !ok2 || n <= 0 {
		return 0, 0
	}
	return n, gb
}

// profileSize reads the memory of "40gb" (or of a whole profile name).
func profileSize(s string) (int, bool) {
	if _, rest, ok := strings.Cut(s, "."); ok {
		s = rest
	}
	gb, err := strconv.Atoi(strings.TrimSuffix(s, "gb"))
	return gb, err == nil && strings.HasSuffix(s, "gb") && gb > 0
}
