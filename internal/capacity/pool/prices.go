package pool

import (
	"fmt"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/money"
)

// validatePrices checks policy.prices, naming each offending field; add
// reports a violation.
func validatePrices(p *apiv1.PoolPrices, add func(field, reason string)) {
	if p == nil {
		return
	}
	check := func(field, v string) {
		if _, err := money.ParseAmount(v); err != nil {
			add(field, err.Error())
		}
	}
	if len(p.GetGpuHour()) > 64 {
		add("policy.prices.gpu_hour", fmt.Sprintf("lists at most 64 models, got %d", len(p.GetGpuHour())))
	}
	for k, v := range p.GetGpuHour() {
		if k == "" || len(k) > 32 {
			add("policy.prices.gpu_hour", fmt.Sprintf("model keys must be 1 to 32 characters, got %q", truncate(k)))
			continue
		}
		check("policy.prices.gpu_hour["+k+"]", v)
	}
	if v := p.GetVcpuHour(); v != "" {
		check("policy.prices.vcpu_hour", v)
	}
	if v := p.GetMemoryGibHour(); v != "" {
		check("policy.prices.memory_gib_hour", v)
	}
	if len(p.GetInstanceHour()) > 256 {
		add("policy.prices.instance_hour", fmt.Sprintf("lists at most 256 flavors, got %d", len(p.GetInstanceHour())))
	}
	for k, v := range p.GetInstanceHour() {
		if k == "" || len(k) > 63 {
			add("policy.prices.instance_hour", fmt.Sprintf("flavor keys must be 1 to 63 characters, got %q", truncate(k)))
			continue
		}
		check("policy.prices.instance_hour["+k+"]", v)
	}
}
