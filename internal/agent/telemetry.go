package agent

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
)

// telemetryTimeout bounds one read of the GPUs' live state: a scrape or a
// heartbeat goes on without it rather than wait on a wedged driver.
const telemetryTimeout = 2 * time.Second

// xidCounts counts the XID errors reported through ReportHealthEvent per
// GPU UUID: NVML has no XID counter, bcd is the one that sees them.
type xidCounts struct {
	mu sync.Mutex
	n  map[string]uint64
}

func (x *xidCounts) add(ev *agentv1.HealthEvent) {
	if ev.GetKind() != "gpu.xid" || ev.GetDevice() == "" {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.n == nil {
		x.n = map[string]uint64{}
	}
	x.n[ev.GetDevice()]++
}

func (x *xidCounts) get(uuid string) uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.n[uuid]
}

// gpuTelemetry reads the GPUs' live state from the hardware backend, with
// the XID counts bcd keeps; nil when the backend reads none or the read
// failed (counted in bcd_gpu_telemetry_errors_total).
func (a *Agent) gpuTelemetry(ctx context.Context) []*agentv1.GpuTelemetry {
	src, ok := a.cfg.Hardware.(hw.TelemetrySource)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, telemetryTimeout)
	defer cancel()
	gpus, err := src.Telemetry(ctx)
	if err != nil {
		a.metrics.telemetryErrors.Inc()
		a.log.Debug("gpu telemetry not read", "err", err)
		return nil
	}
	for _, g := range gpus {
		if g.XidTotal == nil {
			g.XidTotal = proto.Uint64(a.xids.get(g.GetUuid()))
		}
	}
	return gpus
}

var (
	gpuLabels    = []string{"gpu", "uuid"}
	bcdUtil      = prometheus.NewDesc("bcd_gpu_utilization_ratio", "GPU compute utilization over the driver's last sample period, 0 to 1.", gpuLabels, nil)
	bcdMemUsed   = prometheus.NewDesc("bcd_gpu_memory_used_bytes", "GPU memory in use.", gpuLabels, nil)
	bcdMemTotal  = prometheus.NewDesc("bcd_gpu_memory_total_bytes", "GPU memory.", gpuLabels, nil)
	bcdTemp      = prometheus.NewDesc("bcd_gpu_temperature_celsius", "GPU die temperature.", gpuLabels, nil)
	bcdPower     = prometheus.NewDesc("bcd_gpu_power_watts", "GPU power draw.", gpuLabels, nil)
	bcdECC       = prometheus.NewDesc("bcd_gpu_ecc_errors_total", "Volatile ECC errors since the driver loaded, by type (corrected, uncorrected).", append(gpuLabels[:2:2], "type"), nil)
	bcdXID       = prometheus.NewDesc("bcd_gpu_xid_errors_total", "XID errors bcd has seen on the GPU since it started.", gpuLabels, nil)
	gpuCollected = []*prometheus.Desc{bcdUtil, bcdMemUsed, bcdMemTotal, bcdTemp, bcdPower, bcdECC, bcdXID}
)

// gpuCollector exports the GPUs' live state, read at scrape time.
type gpuCollector struct{ a *Agent }

func (c gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range gpuCollected {
		ch <- d
	}
}

func (c gpuCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.a.gpuTelemetry(context.Background()) {
		lv := []string{strconv.Itoa(int(g.GetIndex())), g.GetUuid()}
		emit := func(d *prometheus.Desc, t prometheus.ValueType, set bool, v float64, extra ...string) {
			if set {
				ch <- prometheus.MustNewConstMetric(d, t, v, append(lv, extra...)...)
			}
		}
		emit(bcdUtil, prometheus.GaugeValue, g.UtilizationPercent != nil, g.GetUtilizationPercent()/100)
		emit(bcdMemUsed, prometheus.GaugeValue, g.MemoryUsedBytes != nil, float64(g.GetMemoryUsedBytes()))
		emit(bcdMemTotal, prometheus.GaugeValue, g.MemoryTotalBytes != nil, float64(g.GetMemoryTotalBytes()))
		emit(bcdTemp, prometheus.GaugeValue, g.TemperatureCelsius != nil, g.GetTemperatureCelsius())
		emit(bcdPower, prometheus.GaugeValue, g.PowerWatts != nil, g.GetPowerWatts())
		emit(bcdECC, prometheus.CounterValue, g.EccCorrectedTotal != nil, float64(g.GetEccCorrectedTotal()), "corrected")
		emit(bcdECC, prometheus.CounterValue, g.EccUncorrectedTotal != nil, float64(g.GetEccUncorrectedTotal()), "uncorrected")
		emit(bcdXID, prometheus.CounterValue, g.XidTotal != nil, float64(g.GetXidTotal()))
	}
}
