package bmc_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/metal/bmc"
)

// ipmiBackend is one way to build an IPMI driver. The IPMI tests run
// against each: an out-of-process BMC driver passes the same BMC tests as
// the built-in.
type ipmiBackend struct {
	name string
	new  func(t *testing.T, address string, creds bmc.Credentials, opts bmc.Options) (bmc.Driver, error)
}

// forEachIPMIBackend runs fn as a parallel subtest per backend: the
// built-in driver in this process, and examples/bmc-driver built into a
// temporary drivers directory, registered, and started as a child process
// for each driver the test builds.
func forEachIPMIBackend(t *testing.T, fn func(t *testing.T, be ipmiBackend)) {
	t.Helper()
	var (
		once sync.Once
		reg  *bmc.Registry
	)
	parent := t
	backends := []ipmiBackend{
		{name: "in-process", new: func(_ *testing.T, address string, creds bmc.Credentials, opts bmc.Options) (bmc.Driver, error) {
			return bmc.New("ipmi", address, creds, opts)
		}},
		{name: "out-of-process", new: func(t *testing.T, address string, creds bmc.Credentials, opts bmc.Options) (bmc.Driver, error) {
			once.Do(func() {
				dir := filepath.Join(parent.TempDir(), "drivers")
				buildExampleDriver(t, filepath.Join(dir, "bmc-driver"))
				reg = bmc.NewRegistry(nil)
				_, err := reg.RegisterDir(t.Context(), dir)
				require.NoError(t, err)
			})
			require.NotNil(t, reg, "the example driver did not build")
			d, err := reg.New("bmc-driver", address, creds, opts)
			if err == nil {
				// The child process lives until the driver is closed.
				t.Cleanup(func() { _ = d.Close(context.Background()) })
			}
			return d, err
		}},
	}
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			fn(t, be)
		})
	}
}

// buildExampleDriver builds examples/bmc-driver to path with the go tool
// that runs the tests.
func buildExampleDriver(t *testing.T, path string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go tool runs this test")
	root, err := filepath.Abs("../../..")
	require.NoError(t, err)
	build := exec.CommandContext(t.Context(), goBin, "build", "-o", path, "./examples/bmc-driver")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./examples/bmc-driver:\n%s", out)
}

func TestRegistryListsBuiltinsAndExternalDrivers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	buildExampleDriver(t, filepath.Join(dir, "acme-ipmi"))
	// Not a driver: a data file beside it is skipped, not run.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "README"), []byte("drivers live here\n"), 0o644))
	reg := bmc.NewRegistry(nil)
	added, err := reg.RegisterDir(t.Context(), dir)
	require.NoError(t, err)
	require.Len(t, added, 1)

	list := reg.List()
	require.Len(t, list, 3)
	for i, want := range []string{"ipmi", "redfish"} {
		require.Equal(t, want, list[i].Name)
		require.True(t, list[i].BuiltIn)
		require.Empty(t, list[i].Path)
		require.NotEmpty(t, list[i].Version)
	}
	ext := list[2]
	require.Equal(t, bmc.DriverInfo{Name: "acme-ipmi", Reports: "ipmi", Version: list[0].Version, Path: filepath.Join(dir, "acme-ipmi"),
		Capabilities: []string{"set_password", "boot_override"}}, ext, "the example serves the built-in IPMI driver of this build")
	require.Equal(t, []string{"ipmi", "redfish", "acme-ipmi"}, reg.Names())

	// A built-in's name, and a name already taken by another binary, are refused.
	_, err = reg.Register(t.Context(), "ipmi", ext.Path)
	require.ErrorContains(t, err, "built-in")
	other := filepath.Join(t.TempDir(), "acme-ipmi")
	require.NoError(t, os.Link(ext.Path, other))
	_, err = reg.Register(t.Context(), "acme-ipmi", other)
	require.ErrorContains(t, err, "taken by "+ext.Path)

	// The registry still builds the built-ins, and refuses an unknown name.
	d, err := reg.New("redfish", "https://10.0.0.5", bmc.NewCredentials("admin", password), bmc.Options{})
	require.NoError(t, err)
	require.Equal(t, "redfish", d.Name())
	_, err = reg.New("acme-redfish", "10.0.0.5", bmc.NewCredentials("admin", password), bmc.Options{})
	require.ErrorIs(t, err, bmc.ErrUnsupported)
}

func TestRegistryRefusesAWritableDriver(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "acme-ipmi")
	require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\nexit 0\n"), 0o755))
	require.NoError(t, os.Chmod(path, 0o777))
	_, err := bmc.NewRegistry(nil).RegisterDir(t.Context(), dir)
	require.ErrorContains(t, err, "writable by group or others")
}

// TestPluginNameStartsTheDriver: "plugin:<path>" in bmc.New starts the
// binary; what it logs reaches the caller's logger without the password;
// a binary that is not a driver is refused with a typed error, the
// password nowhere in it.
func TestPluginNameStartsTheDriver(t *testing.T) {
	t.Parallel()
	sim := bctest.StartIPMISim(t, "admin", password)
	path := filepath.Join(t.TempDir(), "bmc-driver")
	buildExampleDriver(t, path)
	ctx := t.Context()

	logs := &syncBuffer{}
	d, err := bmc.New(bmc.PluginPrefix+path, sim.Address, bmc.NewCredentials("admin", password), bmc.Options{Logger: newDebugLogger(logs)})
	require.NoError(t, err)
	require.Equal(t, bmc.PluginPrefix+path, d.Name())
	st, err := d.PowerStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, bmc.PowerOff, st)
	require.NoError(t, d.Close(ctx))
	require.Contains(t, logs.String(), "bmc call done", "the driver's debug lines reach the host's logger")
	require.NotContains(t, logs.String(), password)

	_, err = bmc.New(bmc.PluginPrefix+"/bin/true", sim.Address, bmc.NewCredentials("admin", password), bmc.Options{})
	require.ErrorIs(t, err, bmc.ErrUnreachable)
	require.ErrorContains(t, err, "handshake failed")
	require.NotContains(t, err.Error(), password)

	_, err = bmc.New(bmc.PluginPrefix+path, "ipmi://10.0.0.5:623/"+password, bmc.NewCredentials("admin", password), bmc.Options{})
	require.ErrorIs(t, err, bmc.ErrInvalidAddress, "the driver process validates the address")
	require.False(t, strings.Contains(err.Error(), password), err.Error())

	_, err = bmc.New(bmc.PluginPrefix, sim.Address, bmc.NewCredentials("admin", password), bmc.Options{})
	require.ErrorIs(t, err, bmc.ErrUnsupported, "a plugin name without a path")
}
