package agent_test

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/release"
)

// bcdBuilds are two real bcd binaries, v0.0.1-test and v0.0.2-test, built
// once per test binary (a build takes about a minute here).
var bcdBuilds struct {
	once     sync.Once
	dir      string
	old, new string
	err      error
	out      []byte
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bcdBuilds.dir != "" {
		_ = os.RemoveAll(bcdBuilds.dir)
	}
	os.Exit(code)
}

func buildBcds(t *testing.T) (oldBin, newBin string) {
	t.Helper()
	bcdBuilds.once.Do(func() {
		dir, err := os.MkdirTemp("", "bcd-upgrade-test-")
		if err != nil {
			bcdBuilds.err = err
			return
		}
		bcdBuilds.dir = dir
		for _, b := range []struct {
			dst     *string
			version string
		}{{&bcdBuilds.old, "v0.0.1-test"}, {&bcdBuilds.new, "v0.0.2-test"}} {
			*b.dst = filepath.Join(dir, "bcd-"+b.version)
			cmd := exec.Command("go", "build", "-ldflags", "-X main.version="+b.version, "-o", *b.dst, "../../cmd/bcd")
			if bcdBuilds.out, bcdBuilds.err = cmd.CombinedOutput(); bcdBuilds.err != nil {
				return
			}
		}
	})
	require.NoError(t, bcdBuilds.err, string(bcdBuilds.out))
	return bcdBuilds.old, bcdBuilds.new
}

func copyExecutable(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	require.NoError(t, err)
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}

// TestBcdProcessUpgradesAndRollsBack runs the real bcd v0.0.1-test
// against the fake gateway, trusting a release key made here; a signed
// release of v0.0.2-test, served over HTTP, is installed by daemon.upgrade:
// the same process re-execs and says Hello as v0.0.2-test, its session
// confirms the upgrade, and daemon.rollback brings v0.0.1-test back the
// same way.
func TestBcdProcessUpgradesAndRollsBack(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skipf("bcd re-execs itself on linux only, not %s", runtime.GOOS)
	}
	oldBin, newBin := buildBcds(t)
	b := setup(t)
	rel := newReleaseFiles(t)

	// The release, signed as `release sign` signs it: from the binary's
	// own build information.
	m, _, err := release.Assemble("v0.0.2-test", "v0.0.1", time.Now(), []release.Input{{Platform: agent.Platform(), Path: newBin}})
	require.NoError(t, err)
	envelope, err := release.Sign(m, rel.key)
	require.NoError(t, err)
	body, err := os.ReadFile(newBin)
	require.NoError(t, err)
	url := rel.serve("/downloads/bcd/v0.0.2-test/"+agent.Platform(), body)

	dir := t.TempDir()
	pub := filepath.Join(dir, "release.pub")
	require.NoError(t, os.WriteFile(pub, rel.key.Public.PEM(), 0o644))
	exe := filepath.Join(dir, "bin", "bcd")
	require.NoError(t, os.Mkdir(filepath.Dir(exe), 0o755))
	copyExecutable(t, oldBin, exe)
	fixture, err := filepath.Abs("sysfs/testdata/dgx2s")
	require.NoError(t, err)
	cmd := exec.Command(exe, "--server", b.gw.addr, "--state-dir", b.stateDir, "--hardware", "fake:dgxh100",
		"--sysfs-root", fixture, "--cgroup-root", b.cgRoot, "--metrics-listen", "", "--log-level", "warn",
		"--release-pubkey", pub)
	cmd.Env = append(os.Environ(), "BCD_JOIN_TOKEN="+b.gw.token)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })

	hello := b.gw.hello(t)
	require.Equal(t, "v0.0.1-test", hello.GetAgentVersion())
	require.Contains(t, hello.GetCapabilities(), agent.CapDaemonUpgrade)

	b.gw.command(&agentv1.Command{Id: "upgrade", Seq: 1, Kind: agent.KindDaemonUpgrade, Params: params(t, map[string]any{
		"manifest": string(envelope), "url": url, "revert_after_seconds": 120, "rollout": "rol_test",
	})})
	u, _ := b.gw.finalUpdate(t, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.Equal(t, map[string]any{"from_version": "v0.0.1-test", "to_version": "v0.0.2-test", "restarting": true}, u.GetResult().AsMap())
	hello = b.gw.hello(t)
	require.Equal(t, "v0.0.2-test", hello.GetAgentVersion(), "the process re-exec'd the new release")
	require.EqualValues(t, 1, hello.GetLastAppliedSeq(), "the command log outlived the re-exec")
	select {
	case err := <-exited:
		t.Fatalf("bcd exited instead of re-executing: %v", err)
	default:
	}
	bctest.WaitFor(t, "upgrade confirmed", func() bool { return readUpgradeJSON(t, b.stateDir)["state"] == "confirmed" })
	fileIs(t, exe+".prev", mustRead(t, oldBin), "the previous binary is kept")

	b.gw.command(&agentv1.Command{Id: "rollback", Seq: 2, Kind: agent.KindDaemonRollback, Params: params(t, map[string]any{"to_version": "v0.0.1-test"})})
	u, _ = b.gw.finalUpdate(t, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.Equal(t, "v0.0.1-test", b.gw.hello(t).GetAgentVersion(), "the process re-exec'd the previous release")
	fileIs(t, exe, mustRead(t, oldBin), "the previous binary is back")
	require.Equal(t, "rolled_back", readUpgradeJSON(t, b.stateDir)["state"])
	select {
	case err := <-exited:
		t.Fatalf("bcd exited: %v", err)
	default:
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}
