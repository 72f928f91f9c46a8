package console

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// The fleet overview's chart: GPUs free and booked over the last 24 hours,
// summed over the viewer's pools from CapacityService.Timeline, drawn on
// the server as an <svg> (no script; presentation attributes, no style)
// with the same numbers in a table for screen readers.

const (
	chartSpan = 24 * time.Hour
	chartStep = time.Hour
	// maxChartPools bounds the timelines one overview reads; the chart
	// says when it leaves pools out.
	maxChartPools = 50
	// The drawing's size in SVG units and its margins for the axes.
	chartW, chartH          = 720, 240
	chartLeft, chartRight   = 48, 28
	chartTop, chartBottom   = 32, 28
	chartPlotW, chartPlotH  = chartW - chartLeft - chartRight, chartH - chartTop - chartBottom
	chartFreeColour         = "#1a7f37"
	chartBookedColour       = "#1f4e79"
	chartGridColour         = "#d0d7de"
	chartBookedDash         = "6 4"
	chartLabelEvery         = 6
	chartFontSize           = "12"
	chartTextColour         = "#57606a"
	chartStrokeWidth        = "2"
	chartGridStrokeWidth    = "1"
	chartLegendY            = 12
	chartLegendFreeX        = chartLeft + 8
	chartLegendBookedX      = chartLeft + 120
	chartLegendSwatchLength = 18
)

// chartPoint is one hour of the chart.
type chartPoint struct {
	Label               string
	Free, Booked, Total int32
	X                   int
	YFree, YBooked      int
}

// tick is a labelled gridline or axis label.
type tick struct {
	Label string
	At    int
}

// fleetChart is what the overview draws.
type fleetChart struct {
	Points []chartPoint
	// FreeLine and BookedLine are the polylines' points attributes.
	FreeLine, BookedLine string
	YTicks, XTicks       []tick
	// PoolsLeftOut counts pools past maxChartPools, not summed.
	PoolsLeftOut int
	Start, End   string
}

// overviewChart reads the last 24 hours of every pool in rows and sums them.
func (c *Console) overviewChart(r *http.Request, s *session, rows []*apiv1.CapacityRow) (fleetChart, error) {
	// Whole seconds, so the API's points fall on the hours asked for at
	// any precision the store keeps; the next second, so what was booked
	// a moment ago is booked at the last point.
	end := c.cfg.Clock.Now().UTC().Truncate(time.Second).Add(time.Second)
	start := end.Add(-chartSpan)
	var pools []string
	seen := map[string]bool{}
	for _, x := range rows {
		if !seen[x.GetPoolId()] {
			seen[x.GetPoolId()] = true
			pools = append(pools, x.GetPoolId())
		}
	}
	var ch fleetChart
	if len(pools) > maxChartPools {
		ch.PoolsLeftOut = len(pools) - maxChartPools
		pools = pools[:maxChartPools]
	}
	n := int(chartSpan/chartStep) + 1
	booked, total := make([]int32, n), make([]int32, n)
	for _, id := range pools {
		res, err := s.api.Capacity.Timeline(r.Context(), connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: s.viewer.TenantID, Pool: id,
			StartTime: timestamppb.New(start), EndTime: timestamppb.New(end), StepSeconds: int64(chartStep / time.Second)}))
		if err != nil {
			return fleetChart{}, err
		}
		for _, pt := range res.Msg.GetPoints() {
			i := int((pt.GetTime().AsTime().Sub(start) + chartStep/2) / chartStep)
			if i >= 0 && i < n {
				booked[i] += pt.GetBooked()
				total[i] += pt.GetTotal()
			}
		}
	}
	ch.Start, ch.End = start.Format("2006-01-02 15:04 UTC"), end.Format("2006-01-02 15:04 UTC")
	drawChart(&ch, start, booked, total)
	return ch, nil
}

// drawChart lays the hourly sums out on the drawing.
func drawChart(ch *fleetChart, start time.Time, booked, total []int32) {
	n := len(booked)
	top := int32(1)
	for i := range n {
		top = max(top, total[i])
	}
	// A round top for the axis: the next multiple of 4 so the halves and
	// quarters are whole GPUs.
	top = (top + 3) / 4 * 4
	y := func(v int32) int { return chartTop + chartPlotH - int(int64(v)*chartPlotH/int64(top)) }
	x := func(i int) int { return chartLeft + i*chartPlotW/max(n-1, 1) }
	var free, bk []string
	for i := range n {
		f := max(total[i]-booked[i], 0)
		p := chartPoint{Label: start.Add(time.Duration(i) * chartStep).Format("Jan 2 15:04"), Free: f, Booked: booked[i], Total: total[i],
			X: x(i), YFree: y(f), YBooked: y(booked[i])}
		ch.Points = append(ch.Points, p)
		free = append(free, strconv.Itoa(p.X)+","+strconv.Itoa(p.YFree))
		bk = append(bk, strconv.Itoa(p.X)+","+strconv.Itoa(p.YBooked))
		if i%chartLabelEvery == 0 || i == n-1 {
			ch.XTicks = append(ch.XTicks, tick{Label: start.Add(time.Duration(i) * chartStep).Format("15:04"), At: p.X})
		}
	}
	ch.FreeLine, ch.BookedLine = strings.Join(free, " "), strings.Join(bk, " ")
	for _, v := range []int32{0, top / 4, top / 2, top * 3 / 4, top} {
		ch.YTicks = append(ch.YTicks, tick{Label: strconv.Itoa(int(v)), At: y(v)})
	}
}

func px(n int) string { return strconv.Itoa(n) }
