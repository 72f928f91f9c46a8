package budget

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// Cost is what one booking commits: its rate over its window.
type Cost struct {
	TenantID   string
	Rate       Micros // per hour
	Start, End time.Time
	// ExcludeReservationID is the booking's own reservation, left out of
	// what is committed (an extension re-costs its whole window).
	ExcludeReservationID string
}

// CostOf prices a quota charge at its pool's prices.
func CostOf(ctx context.Context, q store.Querier, pb *PriceBook, c quota.Charge) (Cost, error) {
	p, err := pb.Of(ctx, q, c.PoolID)
	if err != nil {
		return Cost{}, err
	}
	rate := p.Rate(Item{Model: quota.NormalModel(c.Model), GPUs: c.GPUs, VCPU: c.VCPU, MemoryGiB: c.MemoryGiB, Flavor: c.Flavor})
	return Cost{TenantID: c.TenantID, Rate: rate, Start: c.Start, End: c.End, ExcludeReservationID: c.ExcludeReservationID}, nil
}

// Total is the cost over the whole window.
func (c Cost) Total() Micros { return costOver(c.Rate, c.Start, c.End, c.Start, c.End) }

// periodUse is one period's figures for a cost.
type periodUse struct {
	start, end           time.Time
	committed, requested Micros
}

func (u periodUse) exceeded(b Budget) bool {
	return u.requested > 0 && u.committed+u.requested > b.Amount
}

// uses computes, for each period of b that c's window overlaps, what the
// tenant's other bookings commit in it (counting staged: costs written in
// the same transaction but not yet visible to a query) and what c adds.
func uses(ctx context.Context, q store.Querier, b Budget, c Cost, staged []Cost, pb *PriceBook) ([]periodUse, error) {
	ps := periodsOver(b.Period, c.Start, c.End)
	if len(ps) == 0 {
		return nil, nil
	}
	rows, err := committedRows(ctx, q, b.TenantID, c.ExcludeReservationID, ps[0][0], ps[len(ps)-1][1], pb)
	if err != nil {
		return nil, err
	}
	out := make([]periodUse, len(ps))
	for i, p := range ps {
		u := periodUse{start: p[0], end: p[1], requested: costOver(c.Rate, c.Start, c.End, p[0], p[1])}
		for _, r := range rows {
			u.committed += costOver(r.rate, r.start, r.end, p[0], p[1])
		}
		for _, s := range staged {
			if s.TenantID == b.TenantID && s.ExcludeReservationID != c.ExcludeReservationID {
				u.committed += costOver(s.Rate, s.Start, s.End, p[0], p[1])
			}
		}
		out[i] = u
	}
	return out, nil
}

// worst is the period to report: the first that c passes the budget in,
// else the one it leaves the least of.
func worst(b Budget, us []periodUse) periodUse {
	w := us[0]
	for _, u := range us {
		if u.exceeded(b) {
			return u
		}
		if u.committed+u.requested > w.committed+w.requested {
			w = u
		}
	}
	return w
}

func effectOf(c Cost, b *Budget, us []periodUse) *apiv1.BudgetEffect {
	eff := &apiv1.BudgetEffect{Cost: FormatAmount(c.Total()), CostPerHour: FormatAmount(c.Rate)}
	if b == nil || len(us) == 0 {
		return eff
	}
	w := worst(*b, us)
	eff.HasBudget, eff.Enforcement, eff.PeriodStart = true, b.Enforcement, timestamppb.New(w.start)
	eff.Amount, eff.Committed, eff.Requested = FormatAmount(b.Amount), FormatAmount(w.committed), FormatAmount(w.requested)
	eff.Left = FormatAmount(b.Amount - w.committed - w.requested)
	eff.Exceeded = w.exceeded(*b)
	return eff
}

// Effect computes a charge's cost and its effect on the tenant's budget
// without locking, and never fails for a passed budget (previews: the
// effect says so). A booking checks its cost with the placer's
// Batch.CheckQuota, which calls Check inside the booking's transaction.
func Effect(ctx context.Context, q store.Querier, c quota.Charge) (*apiv1.BudgetEffect, error) {
	var pb PriceBook
	cost, err := CostOf(ctx, q, &pb, c)
	if err != nil {
		return nil, err
	}
	b, err := Get(ctx, q, c.TenantID)
	if errors.Is(err, store.ErrNotFound) {
		return effectOf(cost, nil, nil), nil
	}
	if err != nil {
		return nil, err
	}
	us, err := uses(ctx, q, b, cost, nil, &pb)
	if err != nil {
		return nil, err
	}
	return effectOf(cost, &b, us), nil
}

// Check checks a cost against the tenant's budget b, which the caller read
// and locked in tx (LockTenants), counting staged. A hard budget the cost
// would pass refuses it with SPEND_LIMIT_REACHED; otherwise each threshold
// the period's committed cost reaches for the first time is recorded in tx
// and returned as a budget.threshold event for the caller to emit in the
// same transaction.
func Check(ctx context.Context, tx store.Tx, b Budget, c Cost, staged []Cost, pb *PriceBook, now time.Time) ([]envelope.Event, error) {
	if c.Rate <= 0 {
		return nil, nil
	}
	us, err := uses(ctx, tx, b, c, staged, pb)
	if err != nil {
		return nil, err
	}
	for _, u := range us {
		if b.Enforcement == Hard && u.exceeded(b) {
			return nil, &envelope.Error{Code: envelope.CodeSpendLimitReached, Message: limitMessage(b, c, u)}
		}
	}
	var evs []envelope.Event
	for _, u := range us {
		if u.requested <= 0 {
			continue
		}
		after := u.committed + u.requested
		for _, t := range b.Thresholds {
			if after < (Micros(t)*b.Amount+99)/100 {
				continue
			}
			first, err := reach(ctx, tx, b.ID, u.start, t, now)
			if err != nil {
				return nil, err
			}
			if first {
				evs = append(evs, thresholdEvent(b, u, t, after, now))
			}
		}
	}
	return evs, nil
}

func thresholdEvent(b Budget, u periodUse, percent int, committed Micros, now time.Time) envelope.Event {
	return envelope.Event{Type: "budget.threshold", TenantID: b.TenantID, ResourceType: "Budget", ResourceID: b.ID, Time: now,
		Data: map[string]any{
			"percent": percent, "period": b.Period, "period_start": u.start.Format(time.RFC3339), "period_end": u.end.Format(time.RFC3339),
			"amount": FormatAmount(b.Amount), "committed": FormatAmount(committed), "enforcement": b.Enforcement,
		}}
}

// limitMessage says what the budget allows, what is committed and what
// the request costs, in the period it passes the budget in.
func limitMessage(b Budget, c Cost, u periodUse) string {
	return fmt.Sprintf("spend limit reached: the tenant's hard budget allows %s per %s; in the %s from %s, %s is committed and this request costs %s more (%s an hour), %s over the budget",
		FormatAmount(b.Amount), b.Period, b.Period, u.start.Format("2006-01-02"), FormatAmount(u.committed), FormatAmount(u.requested),
		FormatAmount(c.Rate), FormatAmount(u.committed+u.requested-b.Amount))
}

// Committed is what the tenant's bookings commit in b's period holding at.
func Committed(ctx context.Context, q store.Querier, b Budget, at time.Time) (start, end time.Time, committed Micros, err error) {
	start, end = periodAt(b.Period, at)
	var pb PriceBook
	rows, err := committedRows(ctx, q, b.TenantID, "", start, end, &pb)
	if err != nil {
		return start, end, 0, err
	}
	for _, r := range rows {
		committed += costOver(r.rate, r.start, r.end, start, end)
	}
	return start, end, committed, nil
}

// Spent reports whether a tenant's hard budget is spent for the period
// holding at: what its bookings commit there reaches the amount. Warm
// pools stop refilling then, since each refill would commit more.
func Spent(ctx context.Context, q store.Querier, tenantID string, at time.Time) (bool, error) {
	b, err := Get(ctx, q, tenantID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil || b.Enforcement != Hard {
		return false, err
	}
	_, _, c, err := Committed(ctx, q, b, at)
	return c >= b.Amount, err
}

// Precheck refuses, before a booking is placed and outside any write
// transaction, a charge that would pass its tenant's hard budget even at
// the cheapest model it could be placed on: the request fails fast,
// without a turn in the placer. It locks nothing and records nothing; the
// check at commit (Check, in the placer's batch) is the one that counts.
func Precheck(ctx context.Context, q store.Querier, c quota.Charge) error {
	b, err := Get(ctx, q, c.TenantID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && b.Enforcement != Hard) {
		return nil
	}
	if err != nil {
		return err
	}
	var pb PriceBook
	p, err := pb.Of(ctx, q, c.PoolID)
	if err != nil {
		return err
	}
	rate := p.Lowest(Item{Model: quota.NormalModel(c.Model), GPUs: c.GPUs, VCPU: c.VCPU, MemoryGiB: c.MemoryGiB, Flavor: c.Flavor})
	if rate <= 0 {
		return nil
	}
	cost := Cost{TenantID: c.TenantID, Rate: rate, Start: c.Start, End: c.End, ExcludeReservationID: c.ExcludeReservationID}
	us, err := uses(ctx, q, b, cost, nil, &pb)
	if err != nil {
		return err
	}
	for _, u := range us {
		if u.exceeded(b) {
			return &envelope.Error{Code: envelope.CodeSpendLimitReached, Message: limitMessage(b, cost, u)}
		}
	}
	return nil
}
