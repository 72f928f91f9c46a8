package redfish

import (
	"context"
	"slices"
	"sync"
)

// Power is the machine behind the emulated BMC. The service calls it for
// every power change and reads its state for PowerState; boot is the
// Redfish BootSourceOverrideTarget the machine should boot from this time
// ("" or "None": its own order).
type Power interface {
	// On turns the machine on; it is off when called.
	On(ctx context.Context, boot string) error
	// Off turns the machine off: at once, or, when graceful, by asking the
	// guest (ACPI power button) and returning without waiting.
	Off(ctx context.Context, graceful bool) error
	// Restart restarts a machine that is on: a reset (warm) or off and on
	// again (cold). A boot override forces a cold restart where the machine
	// cannot change its boot device in a warm one.
	Restart(ctx context.Context, boot string, cold bool) error
	// On reports whether the machine is on.
	IsOn(ctx context.Context) (bool, error)
}

// MemoryPower is a simulated machine: its power is a flag, and a graceful
// shutdown succeeds at once (its guest always cooperates). It records every
// boot, so a test sees which device a boot override chose.
type MemoryPower struct {
	mu    sync.Mutex
	on    bool
	boots []string
}

func (m *MemoryPower) On(_ context.Context, boot string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on = true
	m.boots = append(m.boots, bootName(boot))
	return nil
}

func (m *MemoryPower) Off(context.Context, bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on = false
	return nil
}

func (m *MemoryPower) Restart(_ context.Context, boot string, _ bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on = true
	m.boots = append(m.boots, bootName(boot))
	return nil
}

func (m *MemoryPower) IsOn(context.Context) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.on, nil
}

// Boots lists the boot device of every boot so far ("None": its own order).
func (m *MemoryPower) Boots() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.boots)
}

func bootName(boot string) string {
	if boot == "" {
		return "None"
	}
	return boot
}
