//go:build !cgo

package nvml_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/hw/nvml"
)

// A cgo-free bcd refuses the nvml backend and says how to get one.
func TestNewWithoutCgo(t *testing.T) {
	t.Parallel()
	_, err := nvml.New()
	require.ErrorIs(t, err, nvml.ErrUnavailable)
	require.ErrorIs(t, err, nvml.ErrNoCgo)
	require.Contains(t, err.Error(), "CGO_ENABLED=1")
}
