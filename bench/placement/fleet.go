package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/better-compute/better-compute/bench/fleetload"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// pendingSpec is the pending reservations the queued placer gets.
type pendingSpec struct {
	n                           int
	tenantID, projectID, poolID string
	binding                     string
	vcpu, memoryGiB             int
	createdBy                   string
	now                         time.Time
	duration                    time.Duration
}

// insertPending writes n pending 1-GPU reservations as Create leaves one
// that did not fit: no placement, the pool's per-GPU host share, a window
// from now (the placer moves a window whose start has passed to its now).
func insertPending(ctx context.Context, db *store.DB, p pendingSpec) error {
	placement, err := json.Marshal(reservation.PlacementRecord{NUMA: -1, Island: -1})
	if err != nil {
		return err
	}
	start := p.now.UTC().Truncate(time.Second)
	rows := make([][]any, 0, p.n)
	for range p.n {
		rows = append(rows, []any{envelope.NewID(reservation.IDPrefix, p.now), p.tenantID, p.projectID, p.poolID, reservation.StatePending,
			1, p.vcpu, p.memoryGiB, p.binding, start, start.Add(p.duration), string(placement), "[]", "{}", p.createdBy, p.now, p.now})
	}
	return db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return fleetload.BulkInsert(ctx, tx, "reservations", []string{"id", "tenant_id", "project_id", "pool_id", "state", "gpus", "vcpu",
			"memory_gib", "binding", "starts_at", "ends_at", "placement", "conditions", "explanation", "created_by",
			"create_time", "update_time"}, rows)
	})
}
