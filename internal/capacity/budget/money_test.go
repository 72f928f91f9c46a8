package budget

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func TestParseFormatAmount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want Micros
		out  string
	}{
		{"0", 0, "0.00"}, {"12", 12_000_000, "12.00"}, {"0.5", 500_000, "0.50"}, {"2.125", 2_125_000, "2.125"},
		{"0.000001", 1, "0.000001"}, {"1000000000", 1_000_000_000_000_000, "1000000000.00"}, {"007.10", 7_100_000, "7.10"},
	} {
		got, err := ParseAmount(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
		require.Equal(t, tc.out, FormatAmount(got), tc.in)
	}
	for _, bad := range []string{"", "-1", "+1", "1.", ".5", "1e3", "1.0000001", "1,5", "1000000000.000001", "99999999999", " 1", "NaN"} {
		_, err := ParseAmount(bad)
		require.Error(t, err, "%q", bad)
	}
	require.Equal(t, "-3.50", FormatAmount(-3_500_000))
}

func TestPeriods(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 31, 23, 30, 0, 0, time.FixedZone("x", 3600)) // 22:30 UTC, a Thursday
	for _, tc := range []struct {
		kind       string
		start, end time.Time
	}{
		{PeriodMonth, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
		{PeriodWeek, time.Date(2026, 12, 28, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 4, 0, 0, 0, 0, time.UTC)},
		{PeriodDay, time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		s, e := periodAt(tc.kind, at)
		require.Equal(t, tc.start, s, tc.kind)
		require.Equal(t, tc.end, e, tc.kind)
	}
	// A Sunday belongs to the week that began on the Monday before.
	s, _ := periodAt(PeriodWeek, time.Date(2027, 1, 3, 12, 0, 0, 0, time.UTC))
	require.Equal(t, time.Date(2026, 12, 28, 0, 0, 0, 0, time.UTC), s)
	ps := periodsOver(PeriodDay, time.Date(2026, 12, 30, 20, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 1, 0, 0, 0, time.UTC))
	require.Len(t, ps, 3)
}

func TestRate(t *testing.T) {
	t.Parallel()
	p := ParsePrices(&apiv1.PoolPrices{GpuHour: map[string]string{"h100": "2.5", "A100": "1", "*": "0.75"}, VcpuHour: "0.01",
		MemoryGibHour: "0.002", InstanceHour: map[string]string{"gpu-large": "20"}})
	for _, tc := range []struct {
		name string
		it   Item
		want Micros
	}{
		{"listed model", Item{Model: "H100", GPUs: 2}, 5_000_000},
		{"other model takes *", Item{Model: "L4", GPUs: 4}, 3_000_000},
		{"unknown model takes the highest", Item{GPUs: 1}, 2_500_000},
		{"host resources", Item{Model: "A100", GPUs: 1, VCPU: 8, MemoryGiB: 64}, 1_000_000 + 80_000 + 128_000},
		{"a priced flavor replaces the parts", Item{Model: "H100", GPUs: 8, VCPU: 8, Flavor: "gpu-large"}, 20_000_000},
		{"an unpriced flavor costs its parts", Item{VCPU: 2, Flavor: "small"}, 20_000},
	} {
		require.Equal(t, tc.want, p.Rate(tc.it), tc.name)
	}
	require.Zero(t, Prices{}.Rate(Item{Model: "H100", GPUs: 8, VCPU: 8}), "a pool without prices is free")
	require.Equal(t, Micros(4*750_000+20_000), p.Lowest(Item{GPUs: 4, VCPU: 2}), "the cheapest model: * at 0.75")
	require.Equal(t, Micros(5_000_000), p.Lowest(Item{Model: "H100", GPUs: 2}), "a known model is its price")
	require.Equal(t, Micros(20_000_000), p.Lowest(Item{GPUs: 8, Flavor: "gpu-large"}))
	noStar := ParsePrices(&apiv1.PoolPrices{GpuHour: map[string]string{"H100": "2.5"}})
	require.Zero(t, noStar.Lowest(Item{GPUs: 4}), "an unlisted model is free")

	h := func(n float64) time.Time { return time.Unix(0, 0).Add(time.Duration(n * float64(time.Hour))) }
	require.Equal(t, Micros(7_500_000), costOver(2_500_000, h(0), h(3), h(0), h(10)))
	require.Equal(t, Micros(2_500_000), costOver(2_500_000, h(0), h(3), h(2), h(10)), "clipped to the period")
	require.Zero(t, costOver(2_500_000, h(0), h(3), h(3), h(10)))
	// A year of a large rate does not overflow.
	require.Equal(t, Micros(1_000_000_000_000)*24*365, costOver(1_000_000_000_000, h(0), h(24*365), h(0), h(24*365)))
}
