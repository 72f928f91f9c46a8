package dra

import (
	"context"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// WatchHealthStatus implements kubeletplugin.DRAPlugin: the health of
// every offered device, at once, at each change of the offer and every
// HealthResend. A quarantined GPU leaves the ResourceSlice, so new claims
// never get it; this is how a pod already running on it learns (the
// kubelet shows it in the pod's status).
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	tick := time.NewTicker(d.cfg.HealthResend)
	defer tick.Stop()
	for {
		changed := d.cfg.Set.Changed()
		select {
		case <-ctx.Done():
			return nil
		case reports <- d.healthReport():
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

func (d *Driver) healthReport() kubeletplugin.DeviceHealthReport {
	now := time.Now()
	var r kubeletplugin.DeviceHealthReport
	for _, dev := range d.cfg.Set.Devices() {
		h := kubeletplugin.DeviceHealth{
			PoolName: d.cfg.NodeName, DeviceName: deviceName(dev.UUID),
			Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now,
			HealthCheckTimeout: 3 * d.cfg.HealthResend,
		}
		if !dev.Healthy {
			h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, "quarantined by bcd health checks"
		}
		r.Devices = append(r.Devices, h)
	}
	return r
}
