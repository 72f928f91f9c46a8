//go:build !cgo

package nvml

import (
	"context"
	"errors"
	"fmt"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
)

// ErrUnavailable is returned when NVML cannot be loaded or initialised.
var ErrUnavailable = errors.New("nvml unavailable")

// ErrNoCgo says why: go-nvml calls libnvidia-ml through cgo, and this binary
// was built without it.
var ErrNoCgo = errors.New("this bcd was built without cgo (CGO_ENABLED=0); the nvml backend needs a build with cgo: install gcc and build with CGO_ENABLED=1")

// Backend is never opened in a cgo-free build.
type Backend struct{}

var _ hw.Backend = (*Backend)(nil)

// New always fails in a cgo-free build.
func New() (*Backend, error) {
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, ErrNoCgo)
}

// Inventory is never reached: New returns no Backend.
func (*Backend) Inventory(context.Context) (*agentv1.GpuInventory, error) {
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, ErrNoCgo)
}

// Close has nothing to close.
func (*Backend) Close() error { return nil }

// ConfigureMIG is never reached: New returns no Backend.
func (*Backend) ConfigureMIG(context.Context, string, []string) error {
	return fmt.Errorf("%w: %w", ErrUnavailable, ErrNoCgo)
}
