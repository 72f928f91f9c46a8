package fake

import (
	"context"
	"encoding/binary"
	"math"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
)

var _ hw.TelemetrySource = (*Backend)(nil)

// telemetryPeriod is how long a fake GPU's load takes to swing through one
// cycle: slow enough that a dashboard shows a curve, fast enough that a
// minute of scraping sees it move.
const telemetryPeriod = 5 * time.Minute

// gpuList is the fake machine's GPUs, read from its inventory once it has
// been read without error (a failed read, e.g. a cancelled context, is
// tried again next time).
type gpuList struct {
	mu   sync.Mutex
	gpus []*agentv1.Gpu
}

func (l *gpuList) get(ctx context.Context, b *Backend) ([]*agentv1.Gpu, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gpus == nil {
		inv, err := b.Inventory(ctx)
		if err != nil {
			return nil, err
		}
		l.gpus = inv.GetGpus()
	}
	return l.gpus, nil
}

// Telemetry makes up plausible readings for each GPU: a load that swings
// with the time (each GPU out of phase with the others, from its UUID),
// memory in use, temperature and power that follow the load, and a few
// corrected ECC errors on some GPUs. The mocks model no load, so this is
// the fake's own and never goes through the NVML reader.
func (b *Backend) Telemetry(ctx context.Context) ([]*agentv1.GpuTelemetry, error) {
	gpus, err := b.list.get(ctx, b)
	if err != nil {
		return nil, err
	}
	return readings(gpus, time.Now()), nil
}

func readings(gpus []*agentv1.Gpu, now time.Time) []*agentv1.GpuTelemetry {
	out := make([]*agentv1.GpuTelemetry, 0, len(gpus))
	for _, g := range gpus {
		d := digest(g.GetUuid(), "telemetry")
		phase := float64(binary.BigEndian.Uint16(d)) / math.MaxUint16 * 2 * math.Pi
		cycle := 2 * math.Pi * float64(now.UnixNano()%int64(telemetryPeriod)) / float64(telemetryPeriod)
		util := math.Round(50 + 45*math.Sin(cycle+phase))
		total := g.GetMemoryMib() * 1024 * 1024
		used := uint64(float64(total) * (0.05 + 0.85*util/100))
		out = append(out, &agentv1.GpuTelemetry{
			Uuid: g.GetUuid(), Index: g.GetIndex(),
			UtilizationPercent:  proto.Float64(util),
			MemoryUsedBytes:     proto.Uint64(used),
			MemoryTotalBytes:    proto.Uint64(total),
			TemperatureCelsius:  proto.Float64(math.Round(32 + 0.5*util)),
			PowerWatts:          proto.Float64(math.Round(70 + 6.3*util)),
			EccCorrectedTotal:   proto.Uint64(uint64(d[2] % 4)),
			EccUncorrectedTotal: proto.Uint64(0),
		})
	}
	return out
}
