package events_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/store"
)

// BenchmarkInsert measures outbox writes with 8 concurrent writers, each
// committing one event per transaction: on PostgreSQL this is where a global
// writer lock would serialize every commit (run with BC_TEST_POSTGRES_URL).
func BenchmarkInsert(b *testing.B) {
	db := newDB(b)
	ctx := context.Background()
	const writers = 8
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
					return events.Insert(ctx, tx, nil, []envelope.Event{{
						Type: "bench.written", TenantID: "tnt_bench", ResourceType: "Bench",
						ResourceID: fmt.Sprint(i), Time: time.Unix(0, 0).UTC(),
					}})
				})
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// newDB opens a test database with the events module migrated.
func newDB(t testing.TB) *store.DB {
	t.Helper()
	db := bctest.NewDB(t, clock.Real{})
	if err := db.Migrate(context.Background(), events.Migrations()); err != nil {
		t.Fatalf("migrate events: %v", err)
	}
	return db
}
