package health_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/provision"
)

// TestBuiltinDocumentsMatchTheGoProfiles proves that the remediation
// documents expand to the profiles the Go code defined before they became
// documents (internal/profiles/builtin).
func TestBuiltinDocumentsMatchTheGoProfiles(t *testing.T) {
	t.Parallel()
	want := []provision.Profile{
		{Name: health.ProfileGPUReset, Steps: []provision.Step{{Name: "reset-gpu", Kind: health.KindGPUReset, Destructive: true, Timeout: 10 * time.Minute}}},
		{Name: health.ProfileReboot, Steps: []provision.Step{{Name: "reboot", Kind: health.KindNodeReboot, Destructive: true, Timeout: 30 * time.Minute}}},
	}
	require.Equal(t, want, health.Profiles())
}
