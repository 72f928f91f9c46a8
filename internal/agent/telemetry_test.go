package agent_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
)

// family returns one metric family of bcd's registry.
func family(t *testing.T, a *agent.Agent, name string) []*dto.Metric {
	t.Helper()
	mfs, err := a.Metrics().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// bcd exports each GPU's telemetry on its /metrics, read from the hardware
// backend at scrape time, and sends it with every heartbeat; the XID
// errors it is told of are counted per GPU.
func TestGPUTelemetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t, func(c *agent.Config) { c.HeartbeatInterval = 50 * time.Millisecond })

	util := family(t, a, "bcd_gpu_utilization_ratio")
	require.Len(t, util, 8, "one series per GPU")
	for _, m := range util {
		require.NotEmpty(t, label(m, "uuid"))
		require.True(t, m.GetGauge().GetValue() >= 0 && m.GetGauge().GetValue() <= 1)
	}
	for _, name := range []string{"bcd_gpu_memory_used_bytes", "bcd_gpu_memory_total_bytes", "bcd_gpu_temperature_celsius", "bcd_gpu_power_watts", "bcd_gpu_xid_errors_total"} {
		require.Len(t, family(t, a, name), 8, name)
	}
	require.Len(t, family(t, a, "bcd_gpu_ecc_errors_total"), 16, "corrected and uncorrected per GPU")

	uuid := label(util[0], "uuid")
	a.ReportHealthEvent(&agentv1.HealthEvent{Kind: "gpu.xid", Device: uuid, Code: 79, Message: "fell off the bus"})
	for _, m := range family(t, a, "bcd_gpu_xid_errors_total") {
		want := 0.0
		if label(m, "uuid") == uuid {
			want = 1
		}
		require.InDelta(t, want, m.GetCounter().GetValue(), 0, "gpu %s", label(m, "uuid"))
	}

	// Prometheus's naming linter has nothing to say about bcd's series.
	if promtool, err := exec.LookPath("promtool"); err == nil {
		rec := httptest.NewRecorder()
		a.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		cmd := exec.CommandContext(t.Context(), promtool, "check", "metrics")
		cmd.Stdin = rec.Body
		out, _ := cmd.CombinedOutput() // exits 1 on complaints, listed in out
		for _, l := range strings.Split(string(out), "\n") {
			require.False(t, strings.HasPrefix(l, "bcd_"), "promtool check metrics: %s", l)
		}
	}

	// The heartbeats carry the same readings to the gateway.
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	m := b.gw.await(t, "heartbeat with telemetry", func(m *agentv1.AgentMessage) bool { return len(m.GetHeartbeat().GetGpus()) == 8 })
	for _, g := range m.GetHeartbeat().GetGpus() {
		require.NotNil(t, g.UtilizationPercent)
		require.NotNil(t, g.XidTotal)
		if g.GetUuid() == uuid {
			require.EqualValues(t, 1, g.GetXidTotal())
		}
	}
}
