package budget

import (
	"math/big"
	"strings"
	"time"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/money"
)

// Micros is an amount in millionths of the platform's currency unit.
type Micros = money.Micros

// ParseAmount and FormatAmount read and write amounts (package money).
var (
	ParseAmount  = money.ParseAmount
	FormatAmount = money.FormatAmount
)

// Item is what one booking holds, for pricing.
type Item struct {
	// Model is the GPU model placed on, else the one asked for (upper-case).
	Model     string
	GPUs      int
	VCPU      int
	MemoryGiB int
	Flavor    string
}

// Prices are a pool's parsed prices per hour; the zero value is free.
type Prices struct {
	GPU       map[string]Micros
	VCPU      Micros
	MemoryGiB Micros
	Instance  map[string]Micros
}

// ParsePrices reads policy.prices; an unset or malformed price (the pool
// service refuses those) is free.
func ParsePrices(p *apiv1.PoolPrices) Prices {
	var out Prices
	if p == nil {
		return out
	}
	parse := func(s string) Micros {
		m, err := ParseAmount(s)
		if err != nil {
			return 0
		}
		return m
	}
	for k, v := range p.GetGpuHour() {
		if out.GPU == nil {
			out.GPU = map[string]Micros{}
		}
		out.GPU[strings.ToUpper(k)] = parse(v)
	}
	for k, v := range p.GetInstanceHour() {
		if out.Instance == nil {
			out.Instance = map[string]Micros{}
		}
		out.Instance[k] = parse(v)
	}
	out.VCPU, out.MemoryGiB = parse(p.GetVcpuHour()), parse(p.GetMemoryGibHour())
	return out
}

// gpuPrice is the price of one GPU-hour of model: its own, else "*"'s; a
// booking whose model is not known yet (pending, any model) costs the
// highest listed, so what it commits is never understated.
func (p Prices) gpuPrice(model string) Micros {
	if m, ok := p.GPU[model]; ok && model != "" {
		return m
	}
	if m, ok := p.GPU["*"]; ok && model != "" {
		return m
	}
	var top Micros
	for _, m := range p.GPU {
		top = max(top, m)
	}
	return top
}

// Lowest is the rate of an item at the cheapest model it could be placed
// on: a bound below what the booking will cost, for a check made before
// placement that must never refuse what the booking would not.
func (p Prices) Lowest(it Item) Micros {
	if _, ok := p.Instance[it.Flavor]; (ok && it.Flavor != "") || it.Model != "" || it.GPUs <= 0 {
		return p.Rate(it)
	}
	low := Micros(0)
	if _, ok := p.GPU["*"]; ok {
		// Every model has a price: the cheapest of them. (Without "*", a
		// model the pool lists no price for is free.)
		low = p.GPU["*"]
		for _, m := range p.GPU {
			low = min(low, m)
		}
	}
	gpus := Micros(it.GPUs)
	it.GPUs = 0
	return p.Rate(it) + gpus*low
}

// Rate is what an item costs per hour: the flavor's instance-hour price
// when the pool lists one, else its GPUs, vCPUs and memory.
func (p Prices) Rate(it Item) Micros {
	if m, ok := p.Instance[it.Flavor]; ok && it.Flavor != "" {
		return m
	}
	var r Micros
	if it.GPUs > 0 {
		r += Micros(it.GPUs) * p.gpuPrice(it.Model)
	}
	return r + Micros(max(it.VCPU, 0))*p.VCPU + Micros(max(it.MemoryGiB, 0))*p.MemoryGiB
}

// costOver is rate × the hours of [start, end) that fall in [from, to),
// rounded to the nearest micro-unit. The product passes int64 for long
// windows of large rates, so it is taken in big integers.
func costOver(rate Micros, start, end, from, to time.Time) Micros {
	if start.Before(from) {
		start = from
	}
	if end.After(to) {
		end = to
	}
	if rate <= 0 || !end.After(start) {
		return 0
	}
	n := new(big.Int).Mul(big.NewInt(rate), big.NewInt(end.Sub(start).Microseconds()))
	h := big.NewInt(int64(time.Hour / time.Microsecond))
	n.Add(n, new(big.Int).Rsh(h, 1))
	return n.Quo(n, h).Int64()
}
