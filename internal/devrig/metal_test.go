package devrig

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A restart brings the same simulated machines back on the same BMC
// addresses, enrolling none again.
func TestSimMachinesRestart(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "state")
	o := options(state)
	o.Machines = 1
	out := runUntil(t, o, "signed image sample")
	require.Contains(t, out, "sim: 1 simulated machines")
	first, err := os.ReadFile(filepath.Join(state, "sim-machines.json"))
	require.NoError(t, err)
	out = runUntil(t, o, "signed image sample")
	require.Contains(t, out, "sim: 1 simulated machines")
	again, err := os.ReadFile(filepath.Join(state, "sim-machines.json"))
	require.NoError(t, err)
	require.Equal(t, string(first), string(again), "the same machine, BMC address and login")
	fi, err := os.Stat(filepath.Join(state, "sim-machines.json"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "it holds the BMC passwords")
}
