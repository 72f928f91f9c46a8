package quota

// SQL for the control plane's metrics: GPU quota headroom now, read at
// scrape time.

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/internal/store"
)

// GPUHeadroom is one GPU-limited quota and what its scope holds now.
type GPUHeadroom struct {
	ID    string
	Limit int
	// Held is the sum of the GPUs of the scope's live reservations whose
	// window contains compute_now().
	Held int
}

// Headroom is what the quota leaves to book now, never negative.
func (h GPUHeadroom) Headroom() int { return max(0, h.Limit-h.Held) }

// GPUHeadrooms reads every quota that limits GPUs at once with what its
// scope holds at compute_now(), in one query. The scope rule is usageOf's;
// unlike a booking's check, it looks at one instant, not a window.
func GPUHeadrooms(ctx context.Context, q store.Querier, limit int) ([]GPUHeadroom, error) {
	rows, err := q.Query(ctx, `SELECT qt.id, qt.gpus, COALESCE(SUM(r.gpus), 0)
		FROM quotas qt LEFT JOIN reservations r ON r.tenant_id = qt.tenant_id
			AND (qt.project_id = '' OR r.project_id = qt.project_id)
			AND (qt.pool_id = '' OR r.pool_id = qt.pool_id)
			AND (qt.model = '' OR upper(coalesce(nullif(r.gpu_model, ''), r.model)) = qt.model)
			AND r.state IN ('pending', 'placed', 'binding', 'active', 'releasing')
			AND r.starts_at <= compute_now() AND r.ends_at > compute_now()
		WHERE qt.gpus >= 0
		GROUP BY qt.id, qt.gpus ORDER BY qt.id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("read quota headroom: %w", err)
	}
	defer rows.Close()
	var out []GPUHeadroom
	for rows.Next() {
		var (
			h         GPUHeadroom
			lim, held int64
		)
		if err := rows.Scan(&h.ID, &lim, &held); err != nil {
			return nil, fmt.Errorf("read quota headroom: %w", err)
		}
		h.Limit, h.Held = int(lim), int(held)
		out = append(out, h)
	}
	return out, rows.Err()
}
