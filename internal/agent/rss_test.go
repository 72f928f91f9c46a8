package agent_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// TestBcdIdleRSS builds the real bcd binary, joins it to the fake gateway
// and reads its resident memory once the session idles. Slow: it runs only
// with BC_TEST_BCD_RSS=1.
func TestBcdIdleRSS(t *testing.T) {
	if os.Getenv("BC_TEST_BCD_RSS") != "1" {
		t.Skip("set BC_TEST_BCD_RSS=1 to build bcd and measure its idle RSS")
	}
	b := setup(t)
	bin := filepath.Join(t.TempDir(), "bcd")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/bcd").CombinedOutput()
	require.NoError(t, err, string(out))
	fixture, err := filepath.Abs("sysfs/testdata/dgx2s")
	require.NoError(t, err)
	cmd := exec.Command(bin, "--server", b.gw.addr, "--state-dir", b.stateDir, "--hardware", "fake:dgxh100",
		"--sysfs-root", fixture, "--cgroup-root", b.cgRoot, "--metrics-listen", "127.0.0.1:0", "--log-level", "warn")
	cmd.Env = append(os.Environ(), "BCD_JOIN_TOKEN="+b.gw.token)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	b.gw.hello(t)
	b.gw.command(&agentv1.Command{Id: "c1", Seq: 1, Kind: "inventory.refresh"})
	b.gw.finalUpdate(t, 1)
	// Idle in the session: heartbeats only.
	for i := 0; i < 5; i++ {
		b.gw.await(t, "heartbeat", func(m *agentv1.AgentMessage) bool { return m.GetHeartbeat() != nil })
	}
	time.Sleep(2 * time.Second)
	rss := vmRSS(t, cmd.Process.Pid)
	t.Logf("bcd idle in session: VmRSS = %s", rss)
	fmt.Println("BCD_IDLE_VMRSS", rss)
}

func vmRSS(t *testing.T, pid int) string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("no VmRSS")
	return ""
}
