package agent

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
)

// KindGPUMIGConfigure repartitions one GPU: params {"gpu": uuid,
// "profiles": ["3g.40gb", ...]}. The control plane sends it only for a GPU
// no booking holds and that it froze (partition pending) first; the backend
// refuses a GPU a process still runs on.
const KindGPUMIGConfigure = "gpu.mig.configure"

// Failure codes of gpu.mig.configure.
const (
	// FailMIGUnsupported: the hardware backend cannot change MIG layouts.
	FailMIGUnsupported = "MIG_UNSUPPORTED"
	// FailMIGLayout: the GPU cannot hold the layout, or is not this node's.
	FailMIGLayout = "MIG_LAYOUT_INVALID"
	// FailGPUBusy: a process runs on the GPU.
	FailGPUBusy = "GPU_BUSY"
	// FailMIGConfigure: the backend failed part way (the node's next
	// inventory says what the GPU holds now).
	FailMIGConfigure = "MIG_CONFIGURE_FAILED"
)

// configureMIG applies gpu.mig.configure, then sends a fresh inventory
// before the final update, so the control plane sees the new layout by the
// time it hears the command succeeded.
func (a *Agent) configureMIG(ctx context.Context, c *agentv1.Command) (outcome, error) {
	uuid, profiles, err := migParams(c.GetParams())
	if err != nil {
		return outcome{}, fail(FailInvalidParams, err)
	}
	mc, ok := a.cfg.Hardware.(hw.MIGConfigurer)
	if !ok {
		return outcome{}, fail(FailMIGUnsupported, errors.New("this node's hardware backend cannot change MIG layouts"))
	}
	err = mc.ConfigureMIG(ctx, uuid, profiles)
	switch {
	case errors.Is(err, hw.ErrGPUBusy):
		return outcome{}, fail(FailGPUBusy, err)
	case errors.Is(err, hw.ErrMIGLayout), errors.Is(err, hw.ErrNoGPU):
		return outcome{}, fail(FailMIGLayout, err)
	case err != nil:
		a.refreshInventory(ctx) // whatever changed before it failed
		return outcome{}, fail(FailMIGConfigure, err)
	}
	digest := a.refreshInventory(ctx)
	list := make([]any, len(profiles))
	for i, p := range profiles {
		list[i] = p
	}
	res, _ := structpb.NewStruct(map[string]any{"gpu": uuid, "profiles": list, "inventory_digest": digest})
	return outcome{result: res}, nil
}

// refreshInventory reads the inventory and sends it on the current session;
// it returns the snapshot's digest, empty when it could not be read.
func (a *Agent) refreshInventory(ctx context.Context) string {
	sections, digest, err := a.inventory(ctx)
	if err != nil {
		a.log.Warn("inventory after a MIG change", "err", err)
		return ""
	}
	if s := a.currentSession(); s != nil {
		if err := a.sendInventory(s, sections, digest); err != nil {
			a.log.Warn("send inventory", "err", err)
		}
	}
	return digest
}

func migParams(p *structpb.Struct) (string, []string, error) {
	f := p.GetFields()
	uuid := f["gpu"].GetStringValue()
	if uuid == "" {
		return "", nil, errors.New("params: gpu (the GPU's UUID) is required")
	}
	var profiles []string
	for i, v := range f["profiles"].GetListValue().GetValues() {
		s, ok := v.GetKind().(*structpb.Value_StringValue)
		if !ok || s.StringValue == "" {
			return "", nil, fmt.Errorf("params: profiles[%d] is not a profile name", i)
		}
		profiles = append(profiles, s.StringValue)
	}
	if len(profiles) == 0 {
		return "", nil, errors.New("params: profiles must name at least one MIG profile")
	}
	return uuid, profiles, nil
}
