package placer

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// NewTestBatch is a batch in tx outside any placer: it stages rows until
// Flush, or writes them as staged when immediate (the per-item fallback).
func NewTestBatch(tx store.Tx, immediate bool) *Batch {
	b := newBatch(tx, nil, time.Time{})
	b.immediate = immediate
	return b
}

// Flush writes what the batch staged.
func (b *Batch) Flush(ctx context.Context) error { return b.flush(ctx) }
