package budget

import "time"

// Periods.
const (
	PeriodMonth = "month"
	PeriodWeek  = "week"
	PeriodDay   = "day"
)

// Enforcements.
const (
	Hard = "hard"
	Soft = "soft"
)

// DefaultThresholds are the alert percents of a budget set without any.
var DefaultThresholds = []int{50, 80, 100}

// periodAt is the period of kind holding t, in UTC: a calendar month, a
// week from Monday, or a day.
func periodAt(kind string, t time.Time) (start, end time.Time) {
	t = t.UTC()
	switch kind {
	case PeriodMonth:
		start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 1, 0)
	case PeriodWeek:
		d := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		start = d.AddDate(0, 0, -((int(d.Weekday()) + 6) % 7))
		return start, start.AddDate(0, 0, 7)
	default:
		start = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 0, 1)
	}
}

// maxPeriods bounds the periods one check looks at (a window of a year in
// days): a booking lasts at most 30 days, so only a bad row reaches it.
const maxPeriods = 400

// periodsOver lists the periods of kind that [start, end) overlaps.
func periodsOver(kind string, start, end time.Time) [][2]time.Time {
	var out [][2]time.Time
	for t := start; t.Before(end) && len(out) < maxPeriods; {
		s, e := periodAt(kind, t)
		out = append(out, [2]time.Time{s, e})
		t = e
	}
	return out
}
