package quota

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Charge is what a reservation asks of its quotas.
type Charge struct {
	TenantID, ProjectID, PoolID, Model string // Model: the GPU model placed on (or requested)
	GPUs                               int
	// VCPU, MemoryGiB and Flavor are not charged to quotas: the budget
	// check prices them (internal/capacity/budget).
	VCPU, MemoryGiB int
	Flavor          string
	Start, End      time.Time
	// ExcludeReservationID leaves one reservation out of the usage (an
	// extension re-charges its own reservation).
	ExcludeReservationID string
}

// GPUHours is the charge's GPUs times its window in hours; an empty or
// inverted window charges nothing.
func (c Charge) GPUHours() float64 {
	if c.GPUs <= 0 || !c.End.After(c.Start) {
		return 0
	}
	return float64(c.GPUs) * c.End.Sub(c.Start).Hours()
}

// hoursSlack absorbs float rounding in sums of GPU-hours (1e-9 h is 3.6 µs
// of one GPU, below the stores' microsecond resolution), so a charge that
// exactly reaches its limit is never refused for a rounding error.
const hoursSlack = 1e-9

// Effect computes a charge's effect without locking and never fails for an
// exceeded quota (previews: the effect says so). A booking checks its charge
// with the placer's Batch.CheckQuota, the one check that refuses: it locks
// the tenant's quota rows (LockTenants), reads the covering quotas once a
// batch (Covering) and counts the batch's staged charges (CheckCovered).
func Effect(ctx context.Context, q store.Querier, c Charge) (*apiv1.QuotaEffect, error) {
	if c.TenantID == "" {
		return nil, errors.New("quota: a charge needs a tenant")
	}
	qs, err := Covering(ctx, q, c)
	if err != nil {
		return nil, err
	}
	return effectOf(ctx, q, c, qs, nil)
}

// Covering returns the quotas that cover a charge, without locking them
// (LockTenants does, for a booking).
func Covering(ctx context.Context, q store.Querier, c Charge) ([]Quota, error) {
	return covering(ctx, q, c)
}

// CheckCovered checks a charge against quotas Covering returned, counting
// staged: charges written in the same transaction but not yet visible to a
// query (a batch's earlier items). It fails with QUOTA_EXCEEDED like Check.
func CheckCovered(ctx context.Context, q store.Querier, c Charge, qs []Quota, staged []Charge) (*apiv1.QuotaEffect, error) {
	eff, err := effectOf(ctx, q, c, qs, staged)
	if err != nil {
		return nil, err
	}
	if eff.GetExceeded() {
		return eff, &envelope.Error{Code: envelope.CodeQuotaExceeded, Message: exceededMessage(eff, scopeNames(ctx, q, qs)), Quota: eff}
	}
	return eff, nil
}

// scopeNames says each quota's scope in the names the operator typed
// ("tenant, pool h100", "project web, model H100") for refusal messages;
// QuotaUse.scope keeps the ids. A name it cannot read stays an id.
func scopeNames(ctx context.Context, q store.Querier, qs []Quota) map[string]string {
	out := make(map[string]string, len(qs))
	for _, qt := range qs {
		s := ScopeTenant
		if qt.ProjectID != "" {
			name := qt.ProjectID
			if p, err := tenancy.ProjectGet(ctx, q, qt.TenantID, qt.ProjectID); err == nil {
				name = p.Name
			}
			s = "project " + name
		}
		if qt.Model != "" {
			s += ", model " + qt.Model
		}
		if qt.PoolID != "" {
			name := qt.PoolID
			if p, err := pool.Get(ctx, q, "", qt.PoolID); err == nil {
				name = p.Name
			}
			s += ", pool " + name
		}
		out[qt.ID] = "the quota on " + s
	}
	return out
}

// covers reports whether a quota's scope holds a charge.
func (qt Quota) covers(c Charge) bool {
	return c.TenantID == qt.TenantID && (qt.ProjectID == "" || qt.ProjectID == c.ProjectID) &&
		(qt.PoolID == "" || qt.PoolID == c.PoolID) && (qt.Model == "" || qt.Model == NormalModel(c.Model))
}

func effectOf(ctx context.Context, q store.Querier, c Charge, qs []Quota, staged []Charge) (*apiv1.QuotaEffect, error) {
	qs = slices.Clone(qs)
	eff := &apiv1.QuotaEffect{}
	if len(qs) == 0 {
		return eff, nil
	}
	// Broadest scope first: tenant before project, any model or pool before
	// one.
	slices.SortStableFunc(qs, func(a, b Quota) int { return cmp.Compare(a.narrowness(), b.narrowness()) })
	reqGPUs, reqHours := max(c.GPUs, 0), c.GPUHours()
	for _, qt := range qs {
		u, err := usageOf(ctx, q, qt, c.Start, c.End, c.ExcludeReservationID)
		if err != nil {
			return nil, err
		}
		for _, sc := range staged {
			if !qt.covers(sc) || sc.ExcludeReservationID == c.ExcludeReservationID {
				continue
			}
			u.GPUHours += sc.GPUHours()
			if sc.Start.Before(c.End) && sc.End.After(c.Start) {
				u.GPUs += max(sc.GPUs, 0)
			}
		}
		use := useOf(qt, u)
		use.GpusRequested, use.GpuHoursRequested = int32(reqGPUs), reqHours
		// A charge is refused only for what it adds: a CPU-only booking is
		// never refused by a GPU quota, even one already over its limit.
		gpusOver := qt.GPUs != Unlimited && reqGPUs > 0 && u.GPUs+reqGPUs > qt.GPUs
		hoursOver := qt.GPUHours != Unlimited && reqHours > 0 && u.GPUHours+reqHours > qt.GPUHours+hoursSlack
		use.Exceeded = gpusOver || hoursOver
		eff.Exceeded = eff.Exceeded || use.Exceeded
		eff.Uses = append(eff.Uses, use)
	}
	return eff, nil
}

// narrowness orders scopes from the broadest (tenant, any model, any pool)
// to the narrowest.
func (q Quota) narrowness() int {
	n := 0
	if q.ProjectID != "" {
		n += 4
	}
	if q.Model != "" {
		n += 2
	}
	if q.PoolID != "" {
		n++
	}
	return n
}

// useOf reports a quota's limits and usage, with nothing requested.
func useOf(q Quota, u Usage) *apiv1.QuotaUse {
	return &apiv1.QuotaUse{
		QuotaId: q.ID, Scope: q.Scope(),
		GpusLimit: int32(q.GPUs), GpusUsed: int32(u.GPUs),
		GpuHoursLimit: q.GPUHours, GpuHoursUsed: u.GPUHours,
	}
}

// exceededMessage names every exceeded quota with its use and limit.
func exceededMessage(eff *apiv1.QuotaEffect, names map[string]string) string {
	var parts []string
	for _, u := range eff.GetUses() {
		if !u.GetExceeded() {
			continue
		}
		scope := cmp.Or(names[u.GetQuotaId()], u.GetScope())
		if l := u.GetGpusLimit(); l != Unlimited && u.GetGpusUsed()+u.GetGpusRequested() > l {
			parts = append(parts, fmt.Sprintf("%s allows %d GPUs at once: %d in use over the requested window, %d requested",
				scope, l, u.GetGpusUsed(), u.GetGpusRequested()))
		}
		if l := u.GetGpuHoursLimit(); l != Unlimited && u.GetGpuHoursUsed()+u.GetGpuHoursRequested() > l+hoursSlack {
			parts = append(parts, fmt.Sprintf("%s allows %s GPU-hours: %s booked, %s requested",
				scope, hours(l), hours(u.GetGpuHoursUsed()), hours(u.GetGpuHoursRequested())))
		}
	}
	return "quota exceeded: " + strings.Join(parts, "; ")
}

func hours(h float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", h), "0"), ".")
}
