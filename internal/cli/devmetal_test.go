package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/doctest"
)

// devTourMetal are the README tour's bare-metal lines, as they are run
// below against dev --sim-machines.
var devTourMetal = []string{
	"bin/better-compute machines commission sim-m1 --wait 2m",
	"bin/better-compute machines deploy sim-m1 --image sample --wait 2m",
	"bin/better-compute machines release sim-m1 --wait 2m",
	"bin/better-compute workflows list --machine sim-m1",
}

// startDev runs dev with args until the test ends, returning once its
// output contains want.
func startDev(t *testing.T, cfgPath, want string, args ...string) *waitWriter {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	a := newApp("dev", func(k string) (string, bool) {
		v := map[string]string{envConfig: cfgPath}[k]
		return v, v != ""
	})
	out := newWaitWriter(want)
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, a, append([]string{"dev", "--config", cfgPath, "--log-level", "error"}, args...), nil, out, &errb)
	}()
	stopped := false
	t.Cleanup(func() {
		cancel()
		if !stopped {
			<-done
		}
	})
	select {
	case code := <-done:
		stopped = true
		t.Fatalf("dev exited (%d) before printing %q: %s%s", code, want, out.String(), errb.String())
	case <-out.seen:
	}
	return out
}

// TestDevSimMachines: dev --sim-machines 2 enrolls two simulated machines at
// sim-site with a signed sample image, the README tour's lifecycle lines
// run against it (commission → deploy --image sample → release), and a
// restart brings the same machines back without enrolling them again.
func TestDevSimMachines(t *testing.T) {
	t.Parallel()
	readme := doctest.Read(t, "README.md")
	for _, line := range devTourMetal {
		require.Contains(t, readme, line, "the README tour runs what this test runs")
	}
	dir := t.TempDir()
	state, cfgPath := filepath.Join(dir, "state"), filepath.Join(dir, "config.yaml")
	args := []string{"--state-dir", state, "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0", "--sim-machines", "2"}
	out := startDev(t, cfgPath, "signed image sample", args...)
	require.Contains(t, out.String(), "sim: 2 simulated machines (sim-m1…sim-m2")

	env := map[string]string{envConfig: cfgPath, "HOME": dir}
	cli := func(argv ...string) string {
		t.Helper()
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		var o, e bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &o, &e)
		require.Equal(t, 0, code, "%v: %s", argv, e.String())
		return o.String()
	}
	machine := func() (string, string) {
		var m struct {
			Machine struct{ State, WorkflowId string }
		}
		require.NoError(t, json.Unmarshal([]byte(cli("machines", "get", "sim-m1", "-o", "json")), &m))
		return m.Machine.State, m.Machine.WorkflowId
	}
	settled := func(want string) {
		t.Helper()
		bctest.WaitFor(t, "sim-m1 "+want, func() bool {
			st, wf := machine()
			return wf == "" && (st == want || st == "failed")
		})
		st, _ := machine()
		require.Equal(t, want, st, cli("machines", "get", "sim-m1"))
	}
	list := cli("machines", "list")
	require.Contains(t, list, "sim-m1")
	require.Contains(t, list, "sim-m2")
	want := []string{"ready", "deployed", "ready"}
	for i, line := range devTourMetal[:3] {
		// --wait returns once the workflow ended, with the machine there.
		out := cli(strings.Fields(line)[1:]...)
		require.Contains(t, out, want[i])
		settled(want[i])
	}
	tour := cli(strings.Fields(devTourMetal[3])[1:]...)
	for _, op := range []string{"commission", "deploy", "release"} {
		require.Contains(t, tour, op)
	}
	require.Contains(t, cli("machines", "power", "sim-m1", "status"), "power off", "release ends with the machine off")
	wfs := cli("workflows", "list", "--machine", "sim-m1", "--state", "succeeded")
	for _, op := range []string{"commission", "deploy", "release"} {
		require.Contains(t, wfs, op)
	}
	specs, err := os.Stat(filepath.Join(state, "sim-machines.json"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), specs.Mode().Perm())
}
