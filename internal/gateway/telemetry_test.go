package gateway_test

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/gateway"
)

// A heartbeat's GPU telemetry is bounded before the gateway exports it:
// a broken or hostile agent is refused with the field named.
func TestHeartbeatTelemetryValidation(t *testing.T) {
	t.Parallel()
	gpu := func(change func(g *agentv1.GpuTelemetry)) *agentv1.GpuTelemetry {
		g := &agentv1.GpuTelemetry{Uuid: "GPU-0b1c", Index: 0, UtilizationPercent: proto.Float64(50),
			MemoryUsedBytes: proto.Uint64(1 << 30), MemoryTotalBytes: proto.Uint64(80 << 30),
			TemperatureCelsius: proto.Float64(60), PowerWatts: proto.Float64(400)}
		if change != nil {
			change(g)
		}
		return g
	}
	beat := func(gpus ...*agentv1.GpuTelemetry) *agentv1.AgentMessage {
		return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{Gpus: gpus}}}
	}
	many := make([]*agentv1.GpuTelemetry, 65)
	for i := range many {
		many[i] = gpu(func(g *agentv1.GpuTelemetry) { g.Uuid = "GPU-" + strings.Repeat("a", i+1) })
	}
	for _, tc := range []struct {
		name string
		msg  *agentv1.AgentMessage
		want string // "" means accepted
	}{
		{"no telemetry", beat(), ""},
		{"a reading", beat(gpu(nil), gpu(func(g *agentv1.GpuTelemetry) { g.Uuid, g.Index = "GPU-2", 1 })), ""},
		{"unsupported readings unset", beat(&agentv1.GpuTelemetry{Uuid: "GPU-1"}), ""},
		{"too many GPUs", beat(many...), "heartbeat.gpus: more than 64 GPUs"},
		{"no uuid", beat(gpu(func(g *agentv1.GpuTelemetry) { g.Uuid = "" })), "heartbeat.gpus[0].uuid"},
		{"uuid with spaces", beat(gpu(func(g *agentv1.GpuTelemetry) { g.Uuid = "GPU 1; drop" })), "heartbeat.gpus[0].uuid"},
		{"uuid twice", beat(gpu(nil), gpu(nil)), "reported twice"},
		{"negative index", beat(gpu(func(g *agentv1.GpuTelemetry) { g.Index = -1 })), "heartbeat.gpus[0].index"},
		{"utilization over 100", beat(gpu(func(g *agentv1.GpuTelemetry) { g.UtilizationPercent = proto.Float64(101) })), "utilization_percent"},
		{"NaN temperature", beat(gpu(func(g *agentv1.GpuTelemetry) { g.TemperatureCelsius = proto.Float64(math.NaN()) })), "temperature_celsius"},
		{"negative power", beat(gpu(func(g *agentv1.GpuTelemetry) { g.PowerWatts = proto.Float64(-1) })), "power_watts"},
		{"infinite power", beat(gpu(func(g *agentv1.GpuTelemetry) { g.PowerWatts = proto.Float64(math.Inf(1)) })), "power_watts"},
		{"more used than total", beat(gpu(func(g *agentv1.GpuTelemetry) { g.MemoryUsedBytes = proto.Uint64(81 << 30) })), "memory_used_bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := gateway.ValidateAgentMessage(tc.msg)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Equal(t, codes.InvalidArgument, status.Code(err))
			require.Contains(t, err.Error(), tc.want)
		})
	}
}
