package events_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/store"
)

// watcher reads the outbox the way a Watch stream does: from its cursor, in
// pages, counting how often it was served each event.
type watcher struct {
	db     *store.DB
	after  int64
	served map[string]int
}

// poll reads every page available now and reports how many events it got.
func (w *watcher) poll(t *testing.T) int {
	t.Helper()
	got := 0
	for {
		var page []events.Stored
		err := w.db.Read(t.Context(), func(ctx context.Context, tx store.Tx) (err error) {
			page, err = events.ListAfter(ctx, tx, "", true, w.after, 7)
			return err
		})
		require.NoError(t, err)
		for _, ev := range page {
			w.after = ev.Seq
			w.served[ev.ResourceID]++
		}
		got += len(page)
		if len(page) < 7 {
			return got
		}
	}
}

func insertOne(ctx context.Context, tx store.Tx, id string) error {
	return events.Insert(ctx, tx, nil, []envelope.Event{{
		Type: "test.written", TenantID: "tnt_test", ResourceType: "Test", ResourceID: id, Time: time.Unix(0, 0).UTC(),
	}})
}

// TestWatchSeesEveryEventOnceUnderConcurrentCommits is the outbox's order
// guarantee without a writer lock: transactions that took their sequence
// numbers early are held open while later ones commit and a watcher reads
// past them; when they commit, the watcher must still get their events, and
// no event twice. Ordering by seq alone (the old reader without its
// advisory lock) skips every held event here.
func TestWatchSeesEveryEventOnceUnderConcurrentCommits(t *testing.T) {
	t.Parallel()
	if bctest.Dialect() != store.Postgres {
		t.Skip("SQLite has one writer: a transaction held open blocks every other writer, so commits cannot interleave and seq order is commit order")
	}
	db := newDB(t)
	ctx := t.Context()
	w := &watcher{db: db, served: map[string]int{}}

	const rounds, held, fast, perFast = 4, 3, 8, 5
	total := 0
	for r := range rounds {
		// held writers insert first (smaller seqs) and wait to commit.
		release := make([]chan struct{}, held)
		inserted := make(chan struct{}, held)
		errc := make(chan error, held+fast*perFast)
		var wg sync.WaitGroup
		for h := range held {
			release[h] = make(chan struct{})
			wg.Add(1)
			go func() {
				defer wg.Done()
				errc <- db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
					if err := insertOne(ctx, tx, fmt.Sprintf("r%d-held%d", r, h)); err != nil {
						return err
					}
					inserted <- struct{}{}
					<-release[h]
					return nil
				})
			}()
		}
		for range held {
			bctest.Receive(t, "a held writer's insert", inserted)
		}
		// fast writers commit many events around the open ones.
		var fastWG sync.WaitGroup
		for f := range fast {
			fastWG.Add(1)
			go func() {
				defer fastWG.Done()
				for i := range perFast {
					errc <- db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
						return insertOne(ctx, tx, fmt.Sprintf("r%d-fast%d-%d", r, f, i))
					})
				}
			}()
		}
		// The watcher reads while the fast writers commit, and after.
		done := make(chan struct{})
		go func() { fastWG.Wait(); close(done) }()
		for running := true; running; {
			select {
			case <-done:
				running = false
			default:
			}
			w.poll(t)
		}
		w.poll(t)
		// Commit the held ones last, newest first, reading between commits.
		for h := held - 1; h >= 0; h-- {
			close(release[h])
			w.poll(t)
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			require.NoError(t, err)
		}
		total += held + fast*perFast
	}

	// Every writer has committed. Once the horizon has passed them all
	// (another database's transaction on a shared server can hold it back a
	// while), the watcher must have been served each event exactly once.
	var newest uint64
	require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT max(xid) FROM events`).Scan(&newest)
	}))
	bctest.WaitFor(t, "the horizon to pass every writer", func() bool {
		var passed bool
		require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot()) > $1`, newest).Scan(&passed)
		}))
		return passed
	})
	w.poll(t)
	var stored int
	require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&stored)
	}))
	require.Equal(t, total, stored)
	require.Len(t, w.served, total)
	for id, n := range w.served {
		require.Equal(t, 1, n, "event %s served %d times", id, n)
	}
	require.Zero(t, w.poll(t), "nothing is served twice")
}

// TestListAfterRefusesUnknownCursor: a cursor that names no event has no
// position to resume from; a silent empty stream would hide it forever.
func TestListAfterRefusesUnknownCursor(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ctx := t.Context()
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error { return insertOne(ctx, tx, "a") }))
	var last int64
	require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT max(seq) FROM events`).Scan(&last)
	}))
	err := db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		got, err := events.ListAfter(ctx, tx, "", true, last, 10)
		require.Empty(t, got)
		if err != nil {
			return err
		}
		_, err = events.ListAfter(ctx, tx, "", true, last+1000, 10)
		return err
	})
	require.True(t, errors.Is(err, events.ErrUnknownCursor), "got %v", err)
}

// TestWatchFromNowKeepsOpenTransactions: a watch that starts "now" (no
// cursor) must still get the event of a transaction that was open when it
// started and commits after, even though a later transaction committed
// first. Starting after the newest visible event would skip it.
func TestWatchFromNowKeepsOpenTransactions(t *testing.T) {
	t.Parallel()
	if bctest.Dialect() != store.Postgres {
		t.Skip("SQLite has one writer: no transaction can be open while another commits")
	}
	db := newDB(t)
	ctx := t.Context()
	inserted, release, errc := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		errc <- db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			if err := insertOne(ctx, tx, "open"); err != nil {
				return err
			}
			close(inserted)
			<-release
			return nil
		})
	}()
	bctest.Receive(t, "the open transaction's insert", inserted)
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error { return insertOne(ctx, tx, "later") }))
	w := &watcher{db: db, served: map[string]int{}}
	require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		w.after, err = events.LastSeq(ctx, tx)
		return err
	}))
	close(release)
	require.NoError(t, bctest.Receive(t, "the open transaction's commit", errc))
	bctest.WaitFor(t, "the open transaction's event", func() bool {
		w.poll(t)
		return w.served["open"] > 0
	})
}
